"""Per priority class, the service a request of that class is promised: a time to first token and
a time between tokens, each optional (none: that class is admitted whatever the prediction).

Written as flags: `--ttft-objective vip=2,normal=10` (seconds) and `--tbt-objective vip=0.2`;
a class not named has no objective of that kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pdserve.requests import Priority


@dataclass(frozen=True)
class Objective:
    ttft_s: float | None = None
    tbt_s: float | None = None

    @property
    def any(self) -> bool:
        return self.ttft_s is not None or self.tbt_s is not None


@dataclass(frozen=True)
class Objectives:
    by_class: dict[Priority, Objective] = field(default_factory=dict)

    def of(self, priority: Priority) -> Objective:
        return self.by_class.get(priority, Objective())

    @property
    def any(self) -> bool:
        return any(o.any for o in self.by_class.values())


def parse_class_seconds(text: str, what: str) -> dict[Priority, float]:
    """`vip=2,normal=10` -> {VIP: 2.0, NORMAL: 10.0}; raises ValueError naming what is wrong."""
    found: dict[Priority, float] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        try:
            priority = Priority[name.strip().upper()]
        except KeyError:
            raise ValueError(f"{what}: unknown class {name.strip()!r} (one of vip, normal, batch)") from None
        try:
            seconds = float(value) if sep else math.nan
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{what}: {item!r} needs a number of seconds > 0 (as vip=2)")
        if priority in found:
            raise ValueError(f"{what}: class {name.strip()!r} named twice")
        found[priority] = seconds
    return found


def parse_objectives(ttft: str = "", tbt: str = "") -> Objectives:
    """The objectives of the `--ttft-objective` and `--tbt-objective` flags."""
    ttfts, tbts = parse_class_seconds(ttft, "--ttft-objective"), parse_class_seconds(tbt, "--tbt-objective")
    return Objectives({p: Objective(ttfts.get(p), tbts.get(p)) for p in Priority if p in ttfts or p in tbts})
