"""The requests a worker serves, between the stream that opens one and its end: both roles' table.

    open(record, add) ──> live ──close(session)──> end(abort unless the engine finished it)
                           │  └──abort(id) / fail(record, error)──> end(abort) + the stream fails
                           └── the engine fails ──> every live stream fails (fail_all)

The table is the lease on request ids: an id is taken from `open` until its request ends here,
and only then may a new request reuse it. A request ends once: a record that ended before
never touches a newer one under its id. What ending one request frees (the prefill's sends, the
decode's transfer and blocks) is the role's `end` hook. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.engine.faults import RequestFault
from pdserve.errors import DuplicateRequestError, EngineFailed, RequestFailed
from pdserve.requests import Request
from pdserve.worker.session import Session


class LiveRequest(Protocol):
    """A role's record of one request it serves."""

    session: Session  # its stream; `session.request_id` is the record's key
    request: Request | None  # the engine's, bound by `open` on the engine thread before any step of it


R = TypeVar("R", bound=LiveRequest)
EndHook = Callable[[R, bool], None]  # end(record, abort): free what the request holds here; abort it in the engine if asked


class LiveRequests(Generic[R]):
    def __init__(self, engine: AsyncEngine, end: EndHook[R]):
        """`end` runs once per request, after its id was given back. Listens to `engine`: its
        failure fails every live stream, a request's fault in a step fails that one."""
        self._engine = engine
        self._end = end
        self._records: dict[str, R] = {}
        engine.add_failure_listener(self._engine_failed)
        engine.add_request_fault_listener(self._request_fault)

    async def open(self, record: R, add: Callable[[Engine], Request]) -> Session:
        """Take the record's id, then `add(engine)` on the engine thread and bind what it returns.
        DuplicateRequestError, with nothing changed, when the id is taken. Refused, or cancelled
        after the add may have run: the request ends with an abort and the error propagates."""
        self.add(record)

        def bind(engine: Engine) -> None:
            record.request = add(engine)

        try:
            await self._engine.call(bind)
        except BaseException:
            self.end(record, abort=True)
            raise
        return record.session

    def check_free(self, request_id: str) -> None:
        """DuplicateRequestError when a live request holds `request_id`."""
        if request_id in self._records:
            raise DuplicateRequestError(f"request_id {request_id!r} is already running")

    def add(self, record: R) -> None:
        self.check_free(record.session.request_id)
        self._records[record.session.request_id] = record

    def get(self, request_id: str) -> R | None:
        return self._records.get(request_id)

    def owner(self, request: Request) -> R | None:
        """The record the engine's `request` is bound to (None: an ended or an earlier request
        under its id, whose step results must not reach the live one)."""
        record = self._records.get(request.request_id)
        return record if record is not None and record.request is request else None

    def close(self, session: Session) -> None:
        """The stream ended: end its request at once, whatever cancels the caller, with an abort
        unless the engine finished it (the abort is queued now: nothing can withdraw it)."""
        record = self._records.get(session.request_id)
        if record is not None and record.session is session:
            self.end(record, abort=not session.finished_by_engine)

    def abort(self, request_id: str) -> bool:
        """End the request with an abort and fail its stream as cancelled; whether it was live."""
        record = self._records.get(request_id)
        if record is None:
            return False
        self.fail(record, asyncio.CancelledError(f"request {request_id} aborted"))
        return True

    def fail(self, record: R, error: BaseException) -> bool:
        """Free everything now (the stream may be slow to read), then end the stream with
        `error`; False, and nothing done, when the request had ended already."""
        if not self.end(record, abort=True):
            return False
        record.session.fail(error)
        return True

    def end(self, record: R, abort: bool) -> bool:
        """Give the id back and run the role's end hook; False when the request had ended already."""
        if self._records.get(record.session.request_id) is not record:
            return False
        del self._records[record.session.request_id]
        self._end(record, abort)
        return True

    def records(self) -> list[R]:
        """The live requests' records, as of now."""
        return list(self._records.values())

    def fail_all(self, error: BaseException) -> None:
        """End every live stream with `error` (the engine under them is gone); each request ends
        when its stream closes."""
        for record in list(self._records.values()):
            record.session.fail(error)

    def _engine_failed(self, exc: BaseException) -> None:
        self.fail_all(EngineFailed(f"the engine of this worker failed: {exc}"))

    def _request_fault(self, fault: RequestFault) -> None:
        record = self._records.get(fault.request_id)
        if record is not None:
            self.fail(record, RequestFailed(str(fault)))

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._records

    def __getitem__(self, request_id: str) -> R:
        return self._records[request_id]
