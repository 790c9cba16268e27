"""A seeded fault schedule: which signal reaches which worker when.

A worker is busy from a fault's start until it is back: a stopped one until SIGCONT, a killed
or terminated one for an estimated `recovery_s` (restart and model load). Two faults on one
worker never overlap, and at most `max_down_per_role` workers of one role are busy at once
(0: no limit), so that with the default of 1 every role keeps a worker serving, as a
disruption budget would.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.chaos.fleet import role_of


class FaultKind(enum.Enum):
    KILL = "kill"  # SIGKILL; the worker is restarted on its port
    STOP = "stop"  # SIGSTOP, then SIGCONT after `stop_s`
    TERM = "term"  # SIGTERM: the worker drains, exits and is restarted


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the faulted run starts
    kind: FaultKind
    target: str  # a worker's name, e.g. "decode-1"
    stop_s: float = 0.0  # STOP only: seconds between SIGSTOP and SIGCONT

    def busy(self, recovery_s: float) -> tuple[float, float]:
        """The span during which no other fault may reach the same worker."""
        length = self.stop_s if self.kind is FaultKind.STOP else recovery_s
        return self.at_s, self.at_s + length

    def describe(self) -> str:
        pause = f" for {self.stop_s:.1f} s" if self.kind is FaultKind.STOP else ""
        return f"t={self.at_s:7.1f} s  {self.kind.value:4}  {self.target}{pause}"


@dataclass(frozen=True)
class ScheduleSpec:
    count: int
    kinds: tuple[FaultKind, ...]
    targets: tuple[str, ...]  # worker names faults may reach
    window: tuple[float, float]  # every fault starts within [first, last] seconds
    stop_s: tuple[float, float] = (3.0, 15.0)
    recovery_s: float = 30.0
    max_down_per_role: int = 1
    attempts: int = 2000


def plan(spec: ScheduleSpec, seed: int) -> tuple[Fault, ...]:
    """`spec.count` faults in time order; the same spec and seed give the same schedule.

    Raises ValueError when the faults cannot be placed without overlapping on one worker."""
    if spec.count and (not spec.kinds or not spec.targets):
        raise ValueError("faults need at least one kind and one target")
    if spec.window[1] < spec.window[0]:
        raise ValueError(f"empty fault window {spec.window}")
    rng = random.Random(f"chaos-faults:{seed}")
    placed: list[Fault] = []
    for _ in range(spec.count):
        placed.append(_place(rng, spec, placed))
    return tuple(sorted(placed, key=lambda f: (f.at_s, f.target)))


def _draw(rng: random.Random, spec: ScheduleSpec, kind: FaultKind) -> Fault:
    stop_s = round(rng.uniform(*spec.stop_s), 1) if kind is FaultKind.STOP else 0.0
    return Fault(round(rng.uniform(*spec.window), 1), kind, rng.choice(spec.targets), stop_s)


def _place(rng: random.Random, spec: ScheduleSpec, placed: Sequence[Fault]) -> Fault:
    """The kind is drawn first, so that short faults (easier to fit) are not favoured; another
    kind is tried only when that one cannot fit anywhere."""
    first = rng.choice(spec.kinds)
    for kind in (first, *(k for k in spec.kinds if k is not first)):
        for _ in range(spec.attempts):
            fault = _draw(rng, spec, kind)
            if not conflicts(fault, placed, spec):
                return fault
    raise ValueError(f"cannot place {spec.count} faults in {spec.window[0]:.0f}-{spec.window[1]:.0f} s without two "
                     f"on one worker at once or more than {spec.max_down_per_role} per role (a restart counts "
                     f"{spec.recovery_s:.0f} s); fewer faults or a longer span")


def conflicts(fault: Fault, placed: Sequence[Fault], spec: ScheduleSpec) -> bool:
    """True when `fault` would overlap another on its worker, or exceed the role's budget."""
    if any(overlap(fault, other, spec.recovery_s) for other in placed):
        return True
    if not spec.max_down_per_role:
        return False
    role = role_of(fault.target)
    down = sum(role_of(o.target) == role and spans_meet(fault, o, spec.recovery_s) for o in placed)
    return down >= spec.max_down_per_role


def spans_meet(a: Fault, b: Fault, recovery_s: float) -> bool:
    (a0, a1), (b0, b1) = a.busy(recovery_s), b.busy(recovery_s)
    return a0 <= b1 and b0 <= a1


def overlap(a: Fault, b: Fault, recovery_s: float) -> bool:
    """True when both reach the same worker and their busy spans intersect."""
    return a.target == b.target and spans_meet(a, b, recovery_s)


def parse_kinds(value: str) -> tuple[FaultKind, ...]:
    """"kill,stop,term" -> the kinds, in that order."""
    try:
        return tuple(FaultKind(v.strip()) for v in value.split(",") if v.strip())
    except ValueError as exc:
        raise ValueError(f"fault kinds are {', '.join(k.value for k in FaultKind)}; got {value!r}") from exc


def format_schedule(faults: Sequence[Fault]) -> str:
    if not faults:
        return "fault schedule: none"
    return "\n".join([f"fault schedule ({len(faults)}):", *(f"  {f.describe()}" for f in faults)])
