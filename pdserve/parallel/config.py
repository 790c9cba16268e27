"""Defaults of a tensor-parallel worker's ranks (the size itself is EngineConfig.tensor_parallel_size)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorParallelConfig:
    host: str = "127.0.0.1"  # where the ranks of one worker meet (they share a machine)
    collective_timeout_s: float = 60.0  # an all-reduce or all-gather waiting longer fails its rank
    start_timeout_s: float = 300.0  # every follower rank joined and loaded its shard
    stop_grace_s: float = 5.0  # followers told to stop are killed after this
    poll_s: float = 0.05  # how often start-up looks at the followers' processes
    watch_s: float = 0.5  # how often rank 0 looks for a lost follower, and a follower for a lost rank 0
