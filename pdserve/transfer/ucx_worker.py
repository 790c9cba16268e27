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
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from pdserve.transfer.base import TransferError

log = logging.getLogger(__name__)


def _binding() -> Any:
    import ucxx._lib.libucxx as libucxx

    return libucxx


def _array(buffer: Any) -> Any:
    from ucxx._lib.arr import Array

    return Array(buffer)


@functools.cache
def _request_canceller() -> Callable[[int], None] | None:
    """ucxx::Request::cancel, which the Python binding only calls when a request is dropped.

    Calling it directly keeps the request object, so the caller can observe when the request
    has really finished (a receive already matched keeps writing until it completes). Looked up
    once per process: loading the library anew for every worker left ctypes garbage behind.
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
class _Posted:
    """Requests a worker posted, the buffers they read or write, and the future they resolve."""

    requests: list[Any]
    keep: list[Any]  # the buffers the requests read or write, alive until the requests end
    future: asyncio.Future = field(repr=False)

    def pending(self) -> list[int]:
        return [i for i, r in enumerate(self.requests) if not r.completed]

    def release(self) -> list[Any]:
        """Drop the request objects (each holds its native worker alive); return the buffers."""
        self.requests = []
        keep, self.keep = self.keep, []
        return keep


@dataclass(eq=False)
class Batch(_Posted):
    """Requests that finish together: the future resolves when all completed or one failed."""

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


@dataclass(eq=False)
class Settling(_Posted):
    """Withdrawn requests still running (a receive already matched, being written): the future
    resolves once every one of them has completed, however it ended."""

    def poll(self) -> bool:
        if not self.future.done() and all(r.completed for r in self.requests):
            self.future.set_result(None)
        return self.future.done()


@dataclass(eq=False)
class Endpoint:
    """A connection to one peer worker; `handle` is the native endpoint until the worker closes."""

    handle: Any


def _request_error(request: Any) -> BaseException | None:
    if not request.completed:
        return None
    try:
        request.check_error()
    except Exception as exc:  # every ucxx error type
        return exc
    return None


# A packed UCP worker address starts with a header byte whose low 4 bits are the address format's
# version (ucp/wireup/address.h); UCX asserts (aborting the process) on one it cannot unpack.
_ADDRESS_VERSION_MASK = 0x0F
_MIN_ADDRESS_BYTES = 16  # the header, the worker's 64-bit id and at least one device


def check_peer_address(peer: bytes, own: bytes) -> None:
    """TransferError unless `peer` could be a worker address of this UCX build (as `own` is): its
    format version and a plausible length. What is checked is what UCX would otherwise abort on."""
    if len(peer) < _MIN_ADDRESS_BYTES:
        raise TransferError(f"{len(peer)} bytes is no UCX worker address")
    if peer[0] & _ADDRESS_VERSION_MASK != own[0] & _ADDRESS_VERSION_MASK:
        raise TransferError("not a UCX worker address of this UCX version "
                            f"(format {peer[0] & _ADDRESS_VERSION_MASK}, ours {own[0] & _ADDRESS_VERSION_MASK})")


def _connect(lib: Any, worker: Any, address: bytes) -> Any:
    check_peer_address(address, bytes(worker.address.tobytes()))
    ucx_address = lib.UCXAddress.create_from_buffer(address)
    return lib.UCXEndpoint.create_from_worker_address(worker, ucx_address, False)


@dataclass(eq=False)
class NativeWorker:
    """A UCX context and worker (and an endpoint, when opened connected) not yet progressed by
    any loop: built on any thread, then handed to `UcxWorker` on the loop's."""

    lib: Any
    context: Any
    worker: Any
    endpoints: list[Any] = field(default_factory=list)

    @classmethod
    def open(cls, options: dict[str, str]) -> "NativeWorker":
        lib = _binding()
        context = lib.UCXContext(options, feature_flags=(lib.Feature.TAG, lib.Feature.WAKEUP))
        worker = lib.UCXWorker(context)
        worker.init_blocking_progress_mode()
        return cls(lib, context, worker)

    @classmethod
    def connected(cls, options: dict[str, str], address: bytes) -> "NativeWorker":
        """A worker of its own with an endpoint to `address` (blocking: run it off the loop)."""
        native = cls.open(options)
        try:
            native.endpoints.append(_connect(native.lib, native.worker, address))
        except BaseException:
            native.destroy()
            raise
        return native

    def destroy(self) -> None:
        """Drop it unused (no request was ever posted): endpoints, then worker, then context."""
        self.endpoints.clear()
        self.worker = self.context = None


class UcxWorker:
    """A UCX worker and the task that progresses it; build it with the loop running.

    `close` destroys the native worker there and then, with every buffer a request touched still
    alive: every batch ever issued is remembered weakly, so a batch kept alive only by a
    reference cycle (an exception's traceback, say) still gives up its requests at close, and no
    UCX object is left for the garbage collector to destroy at some later, arbitrary point.
    """

    def __init__(self, native: "NativeWorker", poll_s: float, idle_s: float, slice_s: float):
        self._lib = native.lib
        self._context, self._worker = native.context, native.worker
        self._fd = self._worker.epoll_file_descriptor
        self._cancel = _request_canceller()
        self._poll_s, self._idle_s, self._slice_s = poll_s, idle_s, slice_s
        self._batches: set[Batch | Settling] = set()
        self._issued: weakref.WeakSet[Batch | Settling] = weakref.WeakSet()
        self._endpoints: list[Endpoint] = [Endpoint(handle) for handle in native.endpoints]
        self._wake: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._drive(), name="ucx-progress")

    @classmethod
    def open(cls, options: dict[str, str], poll_s: float, idle_s: float, slice_s: float) -> "UcxWorker":
        return cls(NativeWorker.open(options), poll_s, idle_s, slice_s)

    def address(self) -> bytes:
        return bytes(self._worker.address.tobytes())

    def endpoint(self) -> Endpoint:
        """The endpoint the worker was opened with (`NativeWorker.connected`)."""
        return self._endpoints[0]

    def send(self, endpoint: Endpoint, messages: list[tuple[Any, int]]) -> Batch:
        """Post tag sends of (buffer, tag); buffers are numpy arrays or CUDA tensors."""
        arrays = [_array(buffer) for buffer, _ in messages]
        tags = [self._lib.UCXXTag(tag) for _, tag in messages]
        return self._track([endpoint.handle.tag_send(a, t) for a, t in zip(arrays, tags)], arrays)

    def recv(self, messages: list[tuple[Any, int]]) -> Batch:
        """Post tag receives matching exactly `tag` (full mask) into the given buffers."""
        arrays = [_array(buffer) for buffer, _ in messages]
        tags = [self._lib.UCXXTag(tag) for _, tag in messages]
        return self._track([self._worker.tag_recv(a, t) for a, t in zip(arrays, tags)], arrays)

    def _track(self, requests: list[Any], keep: list[Any]) -> Batch:
        batch = Batch(requests, keep, self._loop.create_future())
        self._issued.add(batch)
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

    def settling(self, batch: Batch, stuck: list[int]) -> asyncio.Future | None:
        """After `withdraw` returned `stuck`: a future that resolves once those requests have
        completed (nothing of theirs can land in their buffers after that), progressed like any
        other. None when completion cannot be observed (no canceller: the requests were dropped)."""
        if self._cancel is None:
            return None
        settling = Settling([batch.requests[i] for i in stuck], batch.keep, self._loop.create_future())
        self._issued.add(settling)
        if not settling.poll():
            self._batches.add(settling)
            self.kick()
        return settling.future

    def _cancel_and_drain(self, batch: Batch, pending: list[int], drain_s: float) -> list[int]:
        for index in pending:
            self._cancel(batch.requests[index].ucxx_ptr)
        deadline = time.monotonic() + drain_s
        while pending and time.monotonic() < deadline:
            self._worker.progress_once()
            pending = batch.pending()
        return pending

    def abandon(self, batch: Batch, error: BaseException) -> None:
        """Stop tracking a batch and fail it (UCX cannot cancel sends; they only read our memory)."""
        self._batches.discard(batch)
        batch.fail(error)

    def fail_all(self, error: BaseException) -> None:
        for batch in list(self._batches):
            if isinstance(batch, Batch):
                self.withdraw(batch, drain_s=0.0)
                batch.fail(error)

    async def close_endpoint(self, endpoint: Endpoint, timeout_s: float) -> None:
        """Close without waiting past timeout_s (a dead peer may never acknowledge)."""
        request = endpoint.handle.close() if endpoint.handle is not None else None
        if request is not None:
            batch = self._track([request], [])
            if not await self.wait(batch, timeout_s):
                self.abandon(batch, TimeoutError("endpoint close timed out"))

    def kick(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _progress(self) -> bool:
        """ucp progress, one call at a time, for at most slice_s; True if more work may remain."""
        deadline = time.monotonic() + self._slice_s
        while busy := self._worker.progress_once():
            if time.monotonic() >= deadline:
                break
        for batch in [b for b in self._batches if b.poll()]:
            self._batches.discard(batch)
        return busy

    async def _drive(self) -> None:
        while True:
            try:
                if self._progress() or not self._worker.arm():
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
        self._loop.add_reader(self._fd, self.kick)
        timer = self._loop.call_later(timeout_s, self.kick)
        try:
            await wake
        finally:
            timer.cancel()
            self._loop.remove_reader(self._fd)
            self._wake = None

    async def close(self, drain_s: float = 1.0) -> None:
        """Fail every tracked batch, stop progressing and destroy the native worker and context.

        Close endpoints before this. Requests still running are cancelled and progressed for up
        to drain_s; the buffers of every issued batch stay referenced until the worker is gone,
        so nothing its destructor still completes can land in freed memory.
        """
        if self._worker is None:
            return
        self.fail_all(ConnectionError("UCX worker closed"))
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        issued = list(self._issued)
        self._drain(issued, drain_s)
        self._destroy(issued)

    def _destroy(self, issued: list[Batch | Settling]) -> None:
        keep = [buffer for batch in issued for buffer in batch.release()]
        self._batches.clear()
        self._issued = weakref.WeakSet()
        for endpoint in self._endpoints:
            endpoint.handle = None
        self._endpoints.clear()
        self._worker = self._context = None  # the last references: destroyed here, in this order
        del keep
        for batch in issued:  # with the worker gone nothing more can land anywhere
            if isinstance(batch, Settling) and not batch.future.done():
                batch.future.set_result(None)

    def _drain(self, issued: list[Batch | Settling], drain_s: float) -> None:
        for batch in issued:
            for index in batch.pending():
                if self._cancel is not None:
                    self._cancel(batch.requests[index].ucxx_ptr)
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and any(batch.pending() for batch in issued):
            self._worker.progress_once()
        self._worker.progress_once()
