"""Rank 0's side of a follower's KV agent: calls as futures on rank 0's event loop.

A follower gone (its socket at end-of-stream) fails every call in flight and every later one
with RankFailed; rank 0's rank watch ends the worker meanwhile (ranks fail as one).
"""

from __future__ import annotations

import asyncio
import itertools
import socket

from pdserve.parallel.kv_ops import Answer, Call, Op, read_frame, write_frame
from pdserve.parallel.ranks import RankFailed


class FollowerLink:
    """Built with `connect`, on the loop that calls it."""

    def __init__(self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.rank = rank
        self._writer = writer
        self._tokens = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._lost: str | None = None
        self._task = asyncio.ensure_future(self._read(reader))

    @classmethod
    async def connect(cls, rank: int, sock: socket.socket) -> "FollowerLink":
        reader, writer = await asyncio.open_connection(sock=sock)
        return cls(rank, reader, writer)

    def call(self, op: Op) -> asyncio.Future:
        """Send `op` now; the future holds its answer (or the follower's failure, or RankFailed)."""
        future = asyncio.get_running_loop().create_future()
        if self._lost is not None:
            future.set_exception(RankFailed(self._lost))
            return future
        token = next(self._tokens)
        self._pending[token] = future
        write_frame(self._writer, Call(token, op))
        return future

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                self._resolve(await read_frame(reader))
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._lose(f"tensor-parallel rank {self.rank} lost: its KV agent's stream ended ({type(exc).__name__})")

    def _resolve(self, answer: Answer) -> None:
        future = self._pending.pop(answer.token, None)
        if future is None or future.done():
            return
        if answer.failure is not None:
            future.set_exception(answer.failure.error(self.rank))
        else:
            future.set_result(answer.value)

    def _lose(self, why: str) -> None:
        self._lost = why
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(RankFailed(why))

    async def close(self) -> None:
        self._writer.close()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._lose(f"tensor-parallel rank {self.rank}: its KV link was closed")
