"""A Generate call in flight, as the clients hand it out: started at once, read as chunks.

    stream = client.stream("Tell me a story", max_tokens=200, request_id="story-1")
    first = next(stream)       # the request runs on the server from the moment stream() returned
    stream.cancel()            # or client.abort("story-1"): the stream then ends with "abort"

Iterating past a cancel raises PdserveError CANCELLED. Leaving a `with` block, closing the
iterator or dropping it cancels the request too, so nothing runs on that no one reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc

from pdserve.client.results import Collector, now
from pdserve.client.types import Chunk, Completion, PdserveError
from pdserve.client.wire import chunk_of, error_of


class Stream(Iterator[Chunk]):
    """The blocking client's call: an iterator of chunks."""

    def __init__(self, call: grpc.Call):
        self._call = call
        self._chunks = _chunks(call)

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def cancel(self) -> None:
        """Cancels the request (a no-op once it finished)."""
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


class AsyncStream(AsyncIterator[Chunk]):
    """The asyncio client's call: an async iterator of chunks."""

    def __init__(self, call: grpc.aio.UnaryStreamCall):
        self._call = call
        self._chunks = _async_chunks(call)
        self._cancelled = False

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
