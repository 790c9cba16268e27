"""Which of a projection's weights a product of so many rows reads: the panels, the packed copy
or the dense parameter, by ranges of row counts (Linear follows it; pdserve/cpu/ lays the copies
out and measures the route).

    route = RowRoute((4, 16, 64), (PANELS, PACKED, DENSE, PACKED))
    route.kind(3)    # "panels"   (up to 4 rows)
    route.kind(17)   # "dense"    (17 to 64)
    route.kind(999)  # "packed"   (beyond the last bound)

`kinds` has one more entry than `bounds`: kinds[i] serves rows up to bounds[i] (from the bound
before it, exclusive), the last kind every row count beyond. A Linear whose route names a weight
it does not hold reads the next one it has (panels, then packed, then dense), so the default route
serves every explicit layout as before: panels up to PANEL_MAX_ROWS where packed, the packed copy
beyond (and below, where no panels), dense otherwise.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

PANELS, PACKED, DENSE = "panels", "packed", "dense"
PANEL_MAX_ROWS = 256  # rows `--weight-layout panels` reads them for (auto measures its own)
MIN_PACKED_ROWS = 2  # one row is a matrix-vector product, bound by reading the weight (dense is fastest)


@dataclass(frozen=True)
class RowRoute:
    bounds: tuple[int, ...]  # ascending row counts
    kinds: tuple[str, ...]  # len(bounds) + 1 of PANELS | PACKED | DENSE

    def __post_init__(self) -> None:
        if len(self.kinds) != len(self.bounds) + 1 or list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"a route needs ascending bounds and one kind more: {self.bounds}, {self.kinds}")

    def kind(self, rows: int) -> str:
        return self.kinds[bisect_left(self.bounds, rows)]

    def segments(self) -> list[tuple[int | None, str]]:
        """(up to rows, kind), adjacent equal kinds merged; None: every row count beyond."""
        merged: list[tuple[int | None, str]] = []
        for bound, kind in zip((*self.bounds, None), self.kinds):
            if merged and merged[-1][1] == kind:
                merged.pop()
            merged.append((bound, kind))
        return merged

    @classmethod
    def by_probes(cls, rows: tuple[int, ...], winners: list[str]) -> RowRoute:
        """The winner at each probed row count serves the rows up to it from the probe before; the
        last one every row count beyond."""
        return cls(tuple(rows[:-1]), tuple(winners))


DEFAULT_ROUTE = RowRoute((PANEL_MAX_ROWS,), (PANELS, PACKED))  # the explicit layouts'
