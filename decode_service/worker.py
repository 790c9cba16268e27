"""The decode worker beneath its servicer: reserves blocks, takes KV in, streams tokens.

    router --Decode--> open()          engine thread: add_remote -> schedule() reserves blocks
           <-- Reserved(block ids) --  on_step()
    prefill --PushKV--> push_kv()      receiver.expect(piece) into exactly those blocks
    prefill --CompleteKV--> complete() all pieces in -> mark_received(first token) -> decoding
           <-- Tokens ... Finished --  on_step()

Every exit (finish, cancel, abort, deadline, failed transfer) frees the request's blocks within
one step: the transfer is withdrawn first, then the engine aborts the request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.engine.errors import DuplicateRequestError, InvalidRequestError
from pdserve.engine.outputs import StepResult
from pdserve.requests import Priority, SamplingParams
from pdserve.transfer import KVReceiver
from pdserve.worker.events import Finished, Notice, Reserved, Tokens
from pdserve.worker.session import Session, SessionTable

log = logging.getLogger(__name__)


@dataclass
class Intake:
    """KV arriving for one reserved request."""

    transfer_id: str
    block_ids: tuple[int, ...]
    pieces: dict[int, asyncio.Task] = field(default_factory=dict)
    deadline: asyncio.TimerHandle | None = None


@dataclass(frozen=True)
class DecodeJob:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    priority: Priority
    kv_timeout_s: float
    local_prefill: bool
    output_token_ids: tuple[int, ...] = ()


class DecodeWorker:
    def __init__(self, engine: AsyncEngine, receiver: KVReceiver | None):
        self.engine = engine
        self.receiver = receiver
        self.sessions = SessionTable()
        self.intakes: dict[str, Intake] = {}
        self._timeouts: dict[str, float] = {}
        self._transfer_ids = itertools.count()  # a transfer id is never reused, even after a failure
        engine.add_listener(self.on_step)

    async def open(self, job: DecodeJob) -> Session:
        if job.request_id in self.sessions:
            raise DuplicateRequestError(f"request_id {job.request_id!r} is already running")
        if not job.local_prefill and self.receiver is None:
            raise InvalidRequestError("this worker takes no remote KV (colocated mode)")
        session = self.sessions.open(job.request_id)
        self._timeouts[job.request_id] = job.kv_timeout_s
        try:
            await self.engine.call(lambda e: _add(e, job))
        except BaseException:
            self.sessions.close(job.request_id)
            self._timeouts.pop(job.request_id, None)
            raise
        return session

    async def close(self, session: Session) -> None:
        """The stream ended (finished, cancelled or failed): free whatever is left."""
        self.sessions.close(session.request_id)
        self._timeouts.pop(session.request_id, None)
        safe = await self._drop_intake(session.request_id)
        if not session.closed:
            await self.engine.call(lambda e: _abort(e, session.request_id, safe))

    async def abort(self, request_id: str) -> bool:
        session = self.sessions.get(request_id)
        if session is None:
            return False
        safe = await self._drop_intake(request_id)
        found = await self.engine.call(lambda e: _abort(e, request_id, safe))
        session.fail(asyncio.CancelledError(f"request {request_id} aborted"))
        return bool(found)

    # ---- KV intake ----

    def push_kv(self, transfer_id: str, seq: int, block_index: int, src_blocks: Sequence[int], timeout_s: float) -> None:
        intake = self._intake_of(transfer_id)
        end = block_index + len(src_blocks)
        if not src_blocks or end > len(intake.block_ids) or seq in intake.pieces:
            raise InvalidRequestError(
                f"piece {seq} of {transfer_id}: blocks [{block_index}, {end}) outside the reservation "
                f"of {len(intake.block_ids)} blocks or repeated")
        pairs = list(zip(src_blocks, intake.block_ids[block_index:end]))
        self._arm_deadline(intake, self._request_of(transfer_id))
        assert self.receiver is not None
        task = asyncio.ensure_future(self.receiver.expect(transfer_id, seq, pairs, timeout_s))
        task.add_done_callback(lambda t: self._piece_done(transfer_id, t))
        intake.pieces[seq] = task

    async def complete_kv(self, transfer_id: str, num_pieces: int, first_token: int) -> None:
        intake = self._intake_of(transfer_id)
        missing = [s for s in range(num_pieces) if s not in intake.pieces]
        if missing or len(intake.pieces) != num_pieces:
            raise InvalidRequestError(f"{transfer_id}: pieces {missing} were never announced")
        await asyncio.gather(*intake.pieces.values())
        request_id = self._request_of(transfer_id)
        self._cancel_deadline(intake)
        del self.intakes[request_id]
        await self.engine.call(lambda e: e.mark_received(request_id, first_token))

    def _intake_of(self, transfer_id: str) -> Intake:
        intake = self.intakes.get(self._request_of(transfer_id))
        if intake is None or intake.transfer_id != transfer_id:
            raise InvalidRequestError(f"no transfer {transfer_id!r} was set up here")
        return intake

    @staticmethod
    def _request_of(transfer_id: str) -> str:
        return transfer_id.rsplit("#", 1)[0]

    def _piece_done(self, transfer_id: str, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        session = self.sessions.get(self._request_of(transfer_id))
        if session is not None:
            session.fail(task.exception())

    async def _drop_intake(self, request_id: str) -> bool:
        """Withdraw the request's transfer; False when a block may still be written (keep it held)."""
        intake = self.intakes.pop(request_id, None)
        if intake is None:
            return True
        self._cancel_deadline(intake)
        assert self.receiver is not None
        result = self.receiver.cancel(intake.transfer_id)
        for task in intake.pieces.values():
            task.cancel()
        if result.unsafe_blocks:
            log.error("transfer %s: blocks %s may still be written; they stay out of use", intake.transfer_id,
                      result.unsafe_blocks)
        return not result.unsafe_blocks

    def _expire(self, request_id: str) -> None:
        session = self.sessions.get(request_id)
        if session is not None and request_id in self.intakes:
            session.fail(TimeoutError(f"KV for {request_id} did not arrive in time"))

    def _arm_deadline(self, intake: Intake, request_id: str) -> None:
        """KV must keep arriving: at most kv_timeout between pieces and until CompleteKV. Before
        the first piece the router guards the request (it cancels this stream if prefill fails)."""
        self._cancel_deadline(intake)
        timeout = self._timeouts.get(request_id, 30.0)
        intake.deadline = asyncio.get_running_loop().call_later(timeout, self._expire, request_id)

    @staticmethod
    def _cancel_deadline(intake: Intake) -> None:
        if intake.deadline is not None:
            intake.deadline.cancel()

    # ---- engine steps -> sessions ----

    def on_step(self, result: StepResult) -> None:
        for reservation in result.reserved:
            self._on_reserved(reservation.request.request_id, reservation.block_ids)
        for preemption in result.preemptions:
            self._notify(preemption.request.request_id, Notice(preemption.mode.value, preemption.reason, "preempted"))
        for request in result.resumed:
            self._notify(request.request_id, Notice("", "", "resumed"))
        for out in result.outputs:
            self._on_output(out)
        for hold in result.holds.values():  # nothing of a decode worker's is sent on
            self.engine.release_nowait(hold)

    def _on_reserved(self, request_id: str, block_ids: tuple[int, ...]) -> None:
        session = self.sessions.get(request_id)
        if session is None:
            return
        transfer_id = f"{request_id}#{next(self._transfer_ids)}"
        self.intakes[request_id] = Intake(transfer_id, block_ids)
        session.push(Reserved(transfer_id, block_ids))

    def _on_output(self, out) -> None:
        session = self.sessions.get(out.request_id)
        if session is None:
            return
        if out.new_token_ids:
            session.push(Tokens(out.new_token_ids))
        if out.finished:
            r = out.request
            queue_s = max(0.0, (r.first_scheduled_time or r.arrival_time) - r.arrival_time)
            session.push(Finished(r.finish_reason, r.num_cached_tokens, r.num_preemptions, queue_s))

    def _notify(self, request_id: str, notice: Notice) -> None:
        session = self.sessions.get(request_id)
        if session is not None:
            session.push(notice)


def _add(engine: Engine, job: DecodeJob) -> None:
    if job.local_prefill:
        engine.add_request(job.request_id, job.prompt, job.sampling, job.priority, job.output_token_ids)
    else:
        engine.add_remote_request(job.request_id, job.prompt, job.sampling, job.priority)


def _abort(engine: Engine, request_id: str, release: bool) -> bool:
    """Abort and give back the blocks of a withdrawn transfer at once (unless a late write could
    still land in them: then they stay held for good)."""
    result = engine.abort(request_id)
    if release:
        for hold in result.holds:
            engine.release(hold)
    return result.found
