"""The processes under test: a router and its workers, each a real `pdserve` process on loopback.

Two implementations: `SeparateFleet` (each worker its own `pdserve prefill|decode`, restarted
by the fleet itself, as a platform would) and `UpFleet` (one `pdserve up`, whose supervisor
restarts what dies). Workers are named `prefill-0`, `decode-1`, ...; a restarted worker keeps
its name and its port.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from pathlib import Path

from pdserve.config import DeadlineConfig

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class FleetSpec:
    prefill: int = 2
    decode: int = 2
    threads: int = 1
    kv_blocks: int = 256
    host_kv_blocks: int = 64
    token_budget: int = 256
    max_chunk_tokens: int = 128
    kv_timeout_s: float = DeadlineConfig().kv_timeout_s
    drain_timeout_s: float = 10.0
    restart_delay_s: float = 1.0  # separate fleet: from a worker's exit to its restart
    ready_timeout_s: float = 300.0
    deterministic: bool = False  # workers' --deterministic: outputs judged by exact equality (no tie judge)
    reserve_at: str = "prefill"  # the router's --reserve-at
    time_slice_s: float | None = None  # workers' --time-slice-s (0: off); None: the workers' default

    def names(self) -> tuple[str, ...]:
        return (*(f"prefill-{i}" for i in range(self.prefill)), *(f"decode-{i}" for i in range(self.decode)))

    def engine_argv(self) -> list[str]:
        """Engine flags shared by every worker (and by `pdserve up`)."""
        return ["--kv-blocks", str(self.kv_blocks), "--host-kv-blocks", str(self.host_kv_blocks),
                "--token-budget", str(self.token_budget), "--max-chunk-tokens", str(self.max_chunk_tokens),
                *(["--deterministic"] if self.deterministic else []),
                *(["--time-slice-s", str(self.time_slice_s)] if self.time_slice_s is not None else [])]


@dataclass(frozen=True)
class WorkerRef:
    name: str
    role: str
    address: str  # host:port, the same across restarts


def role_of(name: str) -> str:
    return name.split("-")[0]


class Fleet(abc.ABC):
    """Started once, stopped once (in `finally`); signals and restarts in between, from any thread."""

    @abc.abstractmethod
    def start(self) -> str:
        """Starts every process, waits until the router serves; returns its host:port."""

    @abc.abstractmethod
    def workers(self) -> tuple[WorkerRef, ...]:
        """Every worker, in name order; valid once started."""

    @abc.abstractmethod
    def signal(self, name: str, sig: int) -> None:
        """Sends `sig` to the worker's current process (a no-op when it is not running)."""

    @abc.abstractmethod
    def generation(self, name: str) -> int:
        """How many times the worker was (re)started so far; grows by one at each restart."""

    @abc.abstractmethod
    def restarted(self, name: str, since: int) -> bool:
        """True when a process of the worker started after generation `since` is serving."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stops every process it started, whatever state they are in."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line: what runs, for the report."""

    @abc.abstractmethod
    def logs(self) -> Path:
        """The folder of its processes' logs (kept after `stop()`)."""


def chaos_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
