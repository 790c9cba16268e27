"""The chaos experiment's configuration, frozen, built once from presets and flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.chaos.fleet import FleetSpec
from pdserve.chaos.load import LoadSpec
from pdserve.chaos.schedule import Fault, FaultKind


@dataclass(frozen=True)
class FaultPlan:
    """A seeded schedule of `faults` faults, or the given `fixed` one when not empty."""

    faults: int = 4
    kinds: tuple[FaultKind, ...] = (FaultKind.KILL, FaultKind.STOP, FaultKind.TERM)
    roles: tuple[str, ...] = ("prefill", "decode")
    stop_s: tuple[float, float] = (3.0, 15.0)
    recovery_s: float = 30.0  # how long a restart is assumed to take when placing faults
    max_down_per_role: int = 1  # workers of one role faulted at once; 0: no limit
    first_s: float = 2.0  # no fault before this
    span_s: float | None = None  # no fault starts after this; None: 0.8 x the no-fault run's duration
    fixed: tuple[Fault, ...] = ()


@dataclass(frozen=True)
class TieSpec:
    """How outputs that differ from the no-fault run are judged (pdserve.chaos.ties)."""

    tie_judge: str = "reference"  # reference: against the fleet's model in this process | strict: every one real
    tie_epsilon: float = 1e-4  # the largest perturbation a tie may need; measured in pdserve.chaos.ties


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 0
    fleet_kind: str = "separate"  # separate | up | hosts (separate, each process on a test host of its own)
    baseline_fleet: str = "fresh"  # fresh: the no-fault run on a fleet of its own | same: on the faulted one
    fleet: FleetSpec = field(default_factory=FleetSpec)
    load: LoadSpec = field(default_factory=LoadSpec)
    plan: FaultPlan = field(default_factory=FaultPlan)
    ties: TieSpec = field(default_factory=TieSpec)
    settle_s: float = 3.0  # a fault's TBT window lasts this long past its end
    blocks_bound_s: float | None = None  # None: the router's kv timeout + 10 s
    recovery_timeout_s: float = 300.0  # a killed or terminated worker must serve again within this
    duration_limit_s: float = 1200.0  # per run
    progress: bool = True

    @property
    def bound_s(self) -> float:
        return self.fleet.kv_timeout_s + 10.0 if self.blocks_bound_s is None else self.blocks_bound_s
