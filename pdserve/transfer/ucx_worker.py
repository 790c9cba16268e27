"""One UCX worker progressed from an asyncio loop, with tag requests grouped into batches.

Built on ucxx's low-level binding (`ucxx._lib.libucxx`), not on its module-wide application
context, so that every sender and receiver owns its worker (two can live in one process) and no
module state is shared. The ucxx import happens when the first worker is built.

Progress is event-driven, on the loop's thread:

    loop: progress_once() until idle or slice_s spent -> resolve finished batches
          more work: yield to the loop once and go on ; idle: arm(), then wait for the worker's
          epoll fd, a kick from a new post, or a short poll timeout while requests are pending

A rendezvous message is copied inside one ucp progress call (the receiver reads the sender's
memory with CMA), so one call holds the loop for one message: the transports cut runs into
messages of at most `max_message_bytes` to bound it. ucxx's own `progress()` would drain every
arrived message in one call (100 ms for 128 MiB here), which is why it is not used.

Endpoints are created from worker addresses with peer-failure detection off (the fast path);
callers must put deadlines on everything.

One UcxWorker holds one UCX worker per lane (`ucx_lanes`: pull, push), progressed by the same
task; its address names them all, and an endpoint to a peer is one UCX endpoint per peer lane.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from pdserve.transfer.ucx_lanes import LANE_SCHEMES, check_lanes, decode_address, encode_address

log = logging.getLogger(__name__)


def _binding() -> Any:
    import ucxx._lib.libucxx as libucxx

    return libucxx


def _array(buffer: Any) -> Any:
    from ucxx._lib.arr import Array

    return Array(buffer)


def _request_canceller() -> Callable[[int], None] | None:
    """ucxx::Request::cancel, which the Python binding only calls when a request is dropped.

    Calling it directly keeps the request object, so the caller can observe when the request
    has really finished (a receive already matched keeps writing until it completes).
    """
    try:
        import libucxx

        fn = getattr(libucxx.load_library(), "_ZN4ucxx7Request6cancelEv")
    except (ImportError, AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    return fn


@dataclass(eq=False)
class Batch:
    """Requests that finish together: the future resolves when all completed or one failed."""

    requests: list[Any]
    keep: list[Any]  # the buffers the requests read or write, alive until the batch ends
    future: asyncio.Future = field(repr=False)

    def poll(self) -> bool:
        """Resolve the future if the batch is finished; True once resolved."""
        if self.future.done():
            return True
        error = next((e for e in map(_request_error, self.requests) if e is not None), None)
        if error is not None:
            self.fail(error)
        elif all(r.completed for r in self.requests):
            self.future.set_result(None)
        return self.future.done()

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            self.future.exception()

    def pending(self) -> list[int]:
        return [i for i, r in enumerate(self.requests) if not r.completed]


def _request_error(request: Any) -> BaseException | None:
    if not request.completed:
        return None
    try:
        request.check_error()
    except Exception as exc:  # every ucxx error type
        return exc
    return None


Message = tuple[Any, int, int]  # (buffer: numpy array or CUDA tensor, tag, lane)


class UcxWorker:
    """UCX workers (one per lane) and the task that progresses them; build it with the loop running."""

    def __init__(self, options: dict[str, str], lanes: Sequence[str], poll_s: float, idle_s: float,
                 slice_s: float):
        lib = _binding()
        self._lib = lib
        self.lanes = check_lanes(lanes)
        flags = (lib.Feature.TAG, lib.Feature.WAKEUP)
        self._contexts = [lib.UCXContext({**options, "RNDV_SCHEME": LANE_SCHEMES[lane]}, feature_flags=flags)
                          for lane in self.lanes]
        self._workers = [lib.UCXWorker(context) for context in self._contexts]
        for worker in self._workers:
            worker.init_blocking_progress_mode()
        self._fds = [worker.epoll_file_descriptor for worker in self._workers]
        self._first = 0  # the lane progressed first in the next slice (rotates: no lane starves)
        self._cancel = _request_canceller()
        self._poll_s, self._idle_s, self._slice_s = poll_s, idle_s, slice_s
        self._batches: set[Batch] = set()
        self._wake: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._drive(), name="ucx-progress")

    def address(self) -> bytes:
        return encode_address([(lane, bytes(w.address.tobytes())) for lane, w in zip(self.lanes, self._workers)])

    def connect(self, address: bytes) -> tuple[Any, ...]:
        """One endpoint per lane of the peer, each from this side's worker of the same kind."""
        peer = decode_address(address)
        mine = dict(zip(self.lanes, self._workers))
        missing = [lane for lane, _ in peer if lane not in mine]
        if missing:
            raise ValueError(f"the peer uses UCX lanes {[lane for lane, _ in peer]}, this side only {list(self.lanes)}")
        return tuple(self._lib.UCXEndpoint.create_from_worker_address(
            mine[lane], self._lib.UCXAddress.create_from_buffer(raw), False) for lane, raw in peer)

    def send(self, endpoints: tuple[Any, ...], messages: list[Message]) -> Batch:
        """Post tag sends of (buffer, tag, lane) on the endpoint of that lane."""
        arrays = [_array(buffer) for buffer, _, _ in messages]
        requests = [endpoints[lane].tag_send(a, self._lib.UCXXTag(tag)) for a, (_, tag, lane) in zip(arrays, messages)]
        return self._track(requests, arrays)

    def recv(self, messages: list[Message]) -> Batch:
        """Post tag receives matching exactly `tag` (full mask) into the buffers, on their lanes."""
        arrays = [_array(buffer) for buffer, _, _ in messages]
        requests = [self._workers[lane].tag_recv(a, self._lib.UCXXTag(tag))
                    for a, (_, tag, lane) in zip(arrays, messages)]
        return self._track(requests, arrays)

    def _track(self, requests: list[Any], keep: list[Any]) -> Batch:
        batch = Batch(requests, keep, self._loop.create_future())
        if not batch.poll():
            self._batches.add(batch)
        self.kick()
        return batch

    async def wait(self, batch: Batch, timeout_s: float) -> bool:
        """True when the batch finished (check its future), False at the timeout."""
        done, _ = await asyncio.wait({batch.future}, timeout=max(timeout_s, 0.0))
        return bool(done)

    def withdraw(self, batch: Batch, drain_s: float) -> list[int]:
        """Cancel the batch's requests, stop tracking it, return those still running at drain_s.

        A receive not yet matched is removed at once; one already matched is being written and
        is progressed here until it completes or drain_s passes. The caller fails the batch.
        """
        pending = batch.pending()
        if self._cancel is None:
            batch.requests.clear()  # dropping a request cancels it, unobservably: all stay unsafe
        else:
            pending = self._cancel_and_drain(batch, pending, drain_s)
        self._batches.discard(batch)
        self.kick()
        return pending

    def _cancel_and_drain(self, batch: Batch, pending: list[int], drain_s: float) -> list[int]:
        for index in pending:
            self._cancel(batch.requests[index].ucxx_ptr)
        deadline = time.monotonic() + drain_s
        while pending and time.monotonic() < deadline:
            for worker in self._workers:
                worker.progress_once()
            pending = batch.pending()
        return pending

    def abandon(self, batch: Batch, error: BaseException) -> None:
        """Stop tracking a batch and fail it (UCX cannot cancel sends; they only read our memory)."""
        self._batches.discard(batch)
        batch.fail(error)

    def fail_all(self, error: BaseException) -> None:
        for batch in list(self._batches):
            self.withdraw(batch, drain_s=0.0)
            batch.fail(error)

    async def close_endpoint(self, endpoints: tuple[Any, ...], timeout_s: float) -> None:
        """Close every lane's endpoint without waiting past timeout_s (a dead peer may never answer)."""
        requests = [r for r in (endpoint.close() for endpoint in endpoints) if r is not None]
        if not requests:
            return
        batch = self._track(requests, [])
        if not await self.wait(batch, timeout_s):
            self.abandon(batch, TimeoutError("endpoint close timed out"))

    def kick(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _progress(self) -> bool:
        """ucp progress, one call at a time, for at most slice_s; True if more work may remain."""
        deadline = time.monotonic() + self._slice_s
        order = self._workers[self._first :] + self._workers[: self._first]
        self._first = (self._first + 1) % len(self._workers)
        more = False
        for worker in order:
            while worker.progress_once():
                if time.monotonic() >= deadline:
                    more = True
                    break
        for batch in [b for b in self._batches if b.poll()]:
            self._batches.discard(batch)
        return more

    async def _drive(self) -> None:
        while True:
            try:
                if self._progress() or not all([worker.arm() for worker in self._workers]):  # list: arm every one
                    await asyncio.sleep(0)
                    continue
                await self._sleep(self._poll_s if self._batches else self._idle_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("UCX progress failed")
                await asyncio.sleep(self._poll_s)

    async def _sleep(self, timeout_s: float) -> None:
        wake = self._loop.create_future()
        self._wake = wake
        for fd in self._fds:
            self._loop.add_reader(fd, self.kick)
        timer = self._loop.call_later(timeout_s, self.kick)
        try:
            await wake
        finally:
            timer.cancel()
            for fd in self._fds:
                self._loop.remove_reader(fd)
            self._wake = None

    async def close(self) -> None:
        """Fail every tracked batch and stop progressing (close endpoints before this)."""
        self.fail_all(ConnectionError("UCX worker closed"))
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        for worker in self._workers:
            worker.progress_once()
