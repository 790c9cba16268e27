"""Builds what every worker process runs: the engine on its thread and the KV transport."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pdserve.config import EngineConfig
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.engine.faults import injector_from_env
from pdserve.parallel.watch import RankWatch
from pdserve.procs.collector import quiet_collector
from pdserve.start_phases import StartPhases


@dataclass(frozen=True)
class RuntimeConfig:
    """What a worker process runs: its engine, and how many torch threads each of its ranks
    uses (None: all cores)."""

    engine: EngineConfig
    threads: int | None = None


@dataclass
class WorkerRuntime:
    engine: Engine
    async_engine: AsyncEngine
    watches: list[RankWatch] = field(default_factory=list)

    @property
    def block_size(self) -> int:
        return self.engine.kv.block_size

    @property
    def block_nbytes(self) -> int:
        return self.engine.kv.block_nbytes

    def on_failure(self, listener: Callable[[BaseException], None]) -> None:
        """`listener(exc)` runs on the event loop when the engine died (once), and when one of
        its other tensor-parallel ranks was lost, idle or not (once more at most)."""
        self.async_engine.add_failure_listener(listener)
        if self.engine.config.tensor_parallel_size > 1:
            loop = asyncio.get_running_loop()
            watch = RankWatch(self.engine.loaded.ranks, lambda exc: _call_on(loop, listener, exc))
            self.watches.append(watch.start())

    def stop(self) -> None:
        """The engine thread, then the other tensor-parallel ranks (every rank exits)."""
        for watch in self.watches:
            watch.stop()
        self.async_engine.stop()
        self.engine.loaded.ranks.close()


def build_runtime(config: RuntimeConfig, hold_blocks: bool, phases: StartPhases | None = None) -> WorkerRuntime:
    """The engine on its own thread, started on the running event loop; `hold_blocks` for a
    prefill worker (its blocks held until their KV was sent); `phases`: the start's phase log."""
    if config.threads:
        torch.set_num_threads(config.threads)
    engine = Engine(config.engine, hold_blocks=hold_blocks, phases=phases)
    quiet_collector()
    async_engine = AsyncEngine(engine, faults=injector_from_env(os.environ))
    async_engine.start(asyncio.get_running_loop())
    if phases is not None:
        phases.done("engine thread")
    return WorkerRuntime(engine, async_engine)


def _call_on(loop: asyncio.AbstractEventLoop, listener: Callable[[BaseException], None], exc: BaseException) -> None:
    try:
        loop.call_soon_threadsafe(listener, exc)
    except RuntimeError:  # the loop is closed: the worker is stopping anyway
        pass
