"""A follower rank's KV agent: the transfer end over its own heads' pool, served to rank 0 on a
thread and event loop of its own (kv_ops.py says what it is asked and what it answers).

    rank 0 --Call--> agent: op.run(agent) as a task  -> UCX receiver / sender over this rank's pool
                     agent --Answer--> rank 0, when the op is over

The receiver and the sender are built on first use (a colocated worker never builds either).
The agent ends at end-of-stream (rank 0 closed its side or is gone); the follower's process
exits on its own rules (follower.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import torch

from pdserve.parallel.kv_ops import Answer, Call, Failure, read_frame, write_frame
from pdserve.transfer import KVReceiver, KVSender, make_transport

log = logging.getLogger(__name__)


class KVAgent:
    def __init__(self, pool: torch.Tensor, sock: socket.socket):
        self.pool = pool  # [num_blocks, layers, 2, block_size, own kv heads, head_dim]
        self._sock = sock
        self._receiver: KVReceiver | None = None
        self._sender: KVSender | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="kv-agent", daemon=True)
        thread.start()
        return thread

    def receiver(self) -> KVReceiver:
        if self._receiver is None:
            self._receiver = make_transport("ucx").receiver(self.pool)
        return self._receiver

    def sender(self) -> KVSender:
        if self._sender is None:
            self._sender = make_transport("ucx").sender(self.pool)
        return self._sender

    async def _serve(self) -> None:
        reader, writer = await asyncio.open_connection(sock=self._sock)
        tasks: set[asyncio.Task] = set()
        try:
            while True:
                try:
                    call = await read_frame(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                task = asyncio.ensure_future(self._answer(call, writer))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await self._close()
            writer.close()

    async def _answer(self, call: Call, writer: asyncio.StreamWriter) -> None:
        try:
            answer = Answer(call.token, await call.op.run(self))
        except Exception as exc:  # every failure goes back to rank 0, which decides
            answer = Answer(call.token, failure=Failure.of(exc))
        try:
            write_frame(writer, answer)
            await writer.drain()
        except ConnectionError:
            log.debug("rank 0 gone before the answer to call %d", call.token)

    async def _close(self) -> None:
        for end in (self._receiver, self._sender):
            if end is not None:
                await end.close()
