"""Rank 0's view of the other ranks of its worker: told every plan, watched, stopped together.

    Alone       tensor parallel size 1: nothing to tell
    Followers   one process per other rank; plans pickled down each one's stdin pipe

NOTE: plans travel over pipes, not collectives: a follower waits for the next step as long as the
worker is idle (no collective timeout between steps), and reads end-of-file the moment rank 0's
process is gone. The collectives inside a step have the timeout (TensorParallelConfig).
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

from pdserve.parallel.config import TensorParallelConfig
from pdserve.parallel.plan import Plan


class RankFailed(RuntimeError):
    """A follower rank's process is gone: the worker's ranks can no longer compute a step."""


class RankGroup(ABC):
    """`config`: the settings the worker's ranks were started with (its watch interval, its
    timeouts), for whoever watches them."""

    config: TensorParallelConfig = TensorParallelConfig()

    @abstractmethod
    def announce(self, plan: Plan) -> None:
        """Send `plan` to every other rank before rank 0 runs it. Raises RankFailed when one is gone."""

    @abstractmethod
    def gone(self) -> list[str]:
        """A line for each other rank whose process is no longer running."""

    @abstractmethod
    def close(self) -> None:
        """Stop the other ranks and leave the group; idempotent."""

    @abstractmethod
    def kv_sockets(self) -> list[socket.socket]:
        """Rank 0's end of each other rank's KV agent socket (kv_agent.py), rank 1 first."""


class Alone(RankGroup):
    def announce(self, plan: Plan) -> None:
        return None

    def gone(self) -> list[str]:
        return []

    def close(self) -> None:
        return None

    def kv_sockets(self) -> list[socket.socket]:
        return []


class Followers(RankGroup):
    """`procs[i]` is rank i + 1. Any one found gone fails the next announce, after every other
    follower was stopped: the ranks fail as one."""

    def __init__(self, procs: Sequence[subprocess.Popen], leave_group, config: TensorParallelConfig,
                 kv_sockets: Sequence[socket.socket] = ()):
        """`leave_group()`: rank 0 leaves the collectives' group (after the followers stopped).
        Followers told to stop get `config.stop_grace_s`; one that takes no plan for
        `config.collective_timeout_s` (stalled, its pipe full) counts as lost.
        `kv_sockets[i]`: rank 0's end of rank i + 1's KV agent socket."""
        self.procs = list(procs)
        self.config = config
        self._kv_sockets = list(kv_sockets)
        self._leave_group = leave_group
        self._grace_s = config.stop_grace_s
        self._send_timeout_s = config.collective_timeout_s
        self._closed = False
        for proc in self.procs:
            os.set_blocking(proc.stdin.fileno(), False)

    def announce(self, plan: Plan) -> None:
        data = pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)
        for rank, proc in enumerate(self.procs, start=1):
            self._send(rank, proc, data)

    def gone(self) -> list[str]:
        """'rank r (pid p) exited with code c' for each follower no longer running (after
        `close`, those it stopped too)."""
        return [f"rank {rank} (pid {proc.pid}) exited with code {proc.returncode}"
                for rank, proc in enumerate(self.procs, start=1) if proc.poll() is not None]

    def kv_sockets(self) -> list[socket.socket]:
        return list(self._kv_sockets)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            _close_pipe(proc)
        for sock in self._kv_sockets:
            sock.close()
        for proc in self.procs:
            _reap(proc, self._grace_s)
        self._leave_group()

    def _send(self, rank: int, proc: subprocess.Popen, data: bytes) -> None:
        if self._closed:
            raise RankFailed("the worker's ranks were stopped")
        try:
            if proc.poll() is not None:
                raise BrokenPipeError
            _write_all(proc.stdin.fileno(), data, time.monotonic() + self._send_timeout_s)
        except (BrokenPipeError, OSError, ValueError, TimeoutError):
            proc.poll()
            gone = self.gone() or [f"rank {rank} (pid {proc.pid}) took no plan for {self._send_timeout_s:.0f} s"]
            self.close()
            raise RankFailed(f"tensor-parallel rank lost: {'; '.join(gone)}") from None


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    """Write `data` to a non-blocking pipe; TimeoutError when the reader takes none of it until `deadline`."""
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fd], [], left)[1]:
            raise TimeoutError
        view = view[os.write(fd, view):]


def _close_pipe(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
    except OSError:
        pass


def _reap(proc: subprocess.Popen, grace_s: float) -> None:
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
