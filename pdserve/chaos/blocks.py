"""Polls every worker's Stats until none holds an active KV block (the leak check after a run).

A worker that does not answer holds blocks as far as anyone can tell, unless it is `excused`:
its process was killed or terminated and is not back yet, and a process that is gone holds
nothing (its restart starts empty). A stopped worker is never excused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from pdserve.chaos.fleet import WorkerRef


@dataclass(frozen=True)
class WorkerBlocks:
    """One worker's answer; `active` is None when it did not answer."""

    name: str
    active: int | None
    running: int = 0
    waiting: int = 0


@dataclass(frozen=True)
class Drain:
    """`zero_after_s`: seconds from the load's end until every worker answered 0 active blocks in
    the same poll; None when that did not happen within `limit_s`."""

    zero_after_s: float | None
    limit_s: float
    last: tuple[WorkerBlocks, ...]  # the last poll's answers

    def describe(self) -> str:
        if self.zero_after_s is not None:
            return f"{self.zero_after_s:.1f} s"
        held = ", ".join(f"{w.name}={'?' if w.active is None else w.active}" for w in self.last if w.active != 0)
        return f"not zero after {self.limit_s:.0f} s ({held})"


class StatsPoller:
    """One sync channel per worker, kept open across polls."""

    def __init__(self, workers: Sequence[WorkerRef], timeout_s: float = 2.0):
        import grpc

        from pdserve.v1 import worker_pb2_grpc

        self.workers = tuple(workers)
        self.timeout_s = timeout_s
        self._channels = [grpc.insecure_channel(w.address) for w in self.workers]
        stubs = {"prefill": worker_pb2_grpc.PrefillWorkerStub, "decode": worker_pb2_grpc.DecodeWorkerStub}
        self._stubs = [stubs[w.role](ch) for w, ch in zip(self.workers, self._channels)]

    def poll(self) -> tuple[WorkerBlocks, ...]:
        import grpc

        from pdserve.v1 import worker_pb2 as wpb

        answers = []
        for worker, stub in zip(self.workers, self._stubs):
            try:
                stats = stub.Stats(wpb.StatsRequest(), timeout=self.timeout_s)
            except grpc.RpcError:
                answers.append(WorkerBlocks(worker.name, None))
                continue
            answers.append(WorkerBlocks(worker.name, stats.blocks_active, stats.requests_running,
                                        stats.requests_waiting))
        return tuple(answers)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def all_zero(answers: Sequence[WorkerBlocks], excused: Set[str] = frozenset()) -> bool:
    return all(a.active == 0 or (a.active is None and a.name in excused) for a in answers)


def wait_zero(poll: Callable[[], tuple[WorkerBlocks, ...]], since: float, limit_s: float,
              excused: Callable[[], Set[str]] = frozenset, every_s: float = 0.25) -> Drain:
    """Calls `poll` until every worker reports zero active blocks (or is excused), or until
    `limit_s` after `since` (a Unix time)."""
    while True:
        gone = excused()
        answers = poll()
        elapsed = time.time() - since
        if all_zero(answers, gone):
            return Drain(max(0.0, elapsed), limit_s, answers)
        if elapsed >= limit_s:
            return Drain(None, limit_s, answers)
        time.sleep(every_s)


def drain(workers: Sequence[WorkerRef], since: float, limit_s: float,
          excused: Callable[[], Set[str]] = frozenset) -> Drain:
    """`wait_zero` over the Stats of `workers`."""
    poller = StatsPoller(workers)
    try:
        return wait_zero(poller.poll, since, limit_s, excused)
    finally:
        poller.close()
