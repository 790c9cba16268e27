"""A Generate call in flight, as the clients hand it out: started at once, read as chunks.

    stream = client.stream("Tell me a story", max_tokens=200, request_id="story-1")
    first = next(stream)       # the request runs on the server from the moment stream() returned
    stream.cancel()            # or client.abort("story-1"): the stream then ends with "abort"

Iterating past a cancel raises PdserveError CANCELLED. Leaving a `with` block, closing the
iterator or dropping it cancels the request too, so nothing runs on that no one reads.

A client given several routers continues a stream whose router went away (UNAVAILABLE: it died,
stalled past keepalive, or was cut off) at the next one, after the tokens it has (the request's
resume_from_token and prior_token_ids, pdserve/reattach.py): the chunks go on as if nothing
happened, no token lost or repeated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Generic, TypeVar

import grpc

from pdserve.client.results import Collector, now
from pdserve.client.types import Chunk, Completion, PdserveError
from pdserve.client.wire import chunk_of, error_of

C = TypeVar("C", grpc.Call, grpc.aio.UnaryStreamCall)
Opener = Callable[[int, Sequence[int] | None], C]  # (try, the tokens the client has; None: the first try) -> call
FAILOVER_PAUSE_S = 0.1  # before the next router, unless the last one said when


class Tries(Generic[C]):
    """The calls one stream makes: the first, then one per failover, each after the tokens so far."""

    def __init__(self, open_call: Opener, failovers: int):
        self._open = open_call
        self.left = failovers
        self.tokens: list[int] = []  # the stream's so far (sample 0's: a stream of several never fails over)
        self.count = 0
        self.call: C = open_call(0, None)

    def took(self, chunk: Chunk) -> Chunk:
        self.tokens.extend(chunk.token_ids)
        return chunk

    def pause_after(self, error: PdserveError, cancelled: bool) -> float:
        """The pause before the next call, when the error lets the stream go on elsewhere; else
        raises it (the stream ends there)."""
        if cancelled or self.left <= 0 or error.code != "UNAVAILABLE":
            raise error
        return FAILOVER_PAUSE_S if error.retry_after_s is None else error.retry_after_s

    def next_call(self) -> C:
        self.left -= 1
        self.count += 1
        self.call = self._open(self.count, tuple(self.tokens))
        return self.call


class _OnTries:
    """A stream over its Tries: the call in flight, and how many times it failed over."""

    _tries: Tries

    @property
    def _call(self):
        return self._tries.call

    @property
    def failovers(self) -> int:
        """Times the stream went on at another router (its router went away)."""
        return self._tries.count


class Stream(_OnTries, Iterator[Chunk]):
    """The blocking client's call: an iterator of chunks."""

    def __init__(self, call: grpc.Call | Tries):
        self._tries = call if isinstance(call, Tries) else Tries(lambda i, tokens: call, 0)
        self._cancelled = False
        self._chunks = self._stream()

    def _stream(self) -> Iterator[Chunk]:
        tries = self._tries
        while True:
            try:
                for chunk in _chunks(tries.call):
                    yield tries.took(chunk)
                return
            except PdserveError as error:
                pause = tries.pause_after(error, self._cancelled)
            time.sleep(pause)
            tries.next_call()

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def cancel(self) -> None:
        """Cancels the request (a no-op once it finished)."""
        self._cancelled = True
        self._call.cancel()

    def close(self) -> None:
        self.cancel()
        self._chunks.close()

    def collect(self) -> Completion:
        """Reads the stream to its end: the whole answer, with what the client saw of its timing."""
        collector = Collector(now())
        for chunk in self:
            collector.add(chunk, now())
        return collector.completion

    def collect_samples(self) -> list[Completion]:
        """Reads the stream to its end: one Completion per sample (a request's `n`), by index."""
        started, samples = now(), {}
        for chunk in self:
            samples.setdefault(chunk.index, Collector(started)).add(chunk, now())
        return [samples[i].completion for i in sorted(samples)]

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncStream(_OnTries, AsyncIterator[Chunk]):
    """The asyncio client's call: an async iterator of chunks."""

    def __init__(self, call: grpc.aio.UnaryStreamCall | Tries):
        self._tries = call if isinstance(call, Tries) else Tries(lambda i, tokens: call, 0)
        self._chunks = self._stream()
        self._cancelled = False

    async def _stream(self) -> AsyncIterator[Chunk]:
        tries = self._tries
        while True:
            try:
                async for chunk in _async_chunks(tries.call):
                    yield tries.took(chunk)
                return
            except PdserveError as error:
                pause = tries.pause_after(error, self._cancelled)
            await asyncio.sleep(pause)
            tries.next_call()

    async def __anext__(self) -> Chunk:
        try:
            return await anext(self._chunks)
        except asyncio.CancelledError:
            if not self._cancelled:  # the task itself was cancelled
                raise
            raise PdserveError("CANCELLED", "cancelled by the client") from None

    def cancel(self) -> None:
        """Cancels the request (a no-op once it finished); reading on raises PdserveError
        CANCELLED, as in the blocking client (grpc.aio itself would raise CancelledError)."""
        self._cancelled = True
        self._call.cancel()

    async def aclose(self) -> None:
        self.cancel()
        await self._chunks.aclose()

    async def collect(self) -> Completion:
        """Reads the stream to its end: the whole answer, with what the client saw of its timing."""
        collector = Collector(now())
        async for chunk in self:
            collector.add(chunk, now())
        return collector.completion

    async def collect_samples(self) -> list[Completion]:
        """Reads the stream to its end: one Completion per sample (a request's `n`), by index."""
        started, samples = now(), {}
        async for chunk in self:
            samples.setdefault(chunk.index, Collector(started)).add(chunk, now())
        return [samples[i].completion for i in sorted(samples)]

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _chunks(call: grpc.Call) -> Iterator[Chunk]:
    try:
        for response in call:
            yield chunk_of(response)
    except grpc.RpcError as exc:
        raise error_of(exc) from None
    finally:
        call.cancel()


async def _async_chunks(call: grpc.aio.UnaryStreamCall) -> AsyncIterator[Chunk]:
    try:
        async for response in call:
            yield chunk_of(response)
    except grpc.RpcError as exc:
        raise error_of(exc) from None
    finally:
        call.cancel()
