"""Pass or fail: nothing lost, nothing changed for real, no block left held beyond the bound."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """Blocks times are seconds from the load's end until every worker held no active block;
    None when that did not happen within the poll limit. `*_differ`: outputs unlike the no-fault
    run's that the tie judge called real (they fail the run); `*_ties`: those it called
    floating-point near-ties (reported, not failing)."""

    lost: int
    baseline_lost: int
    greedy_differ: int
    seeded_differ: int
    greedy_ties: int
    seeded_ties: int
    blocks_zero_after_s: float | None
    baseline_blocks_zero_after_s: float | None
    blocks_bound_s: float
    faults_injected: int
    faults_not_recovered: int

    @property
    def failures(self) -> tuple[str, ...]:
        found = []
        if self.lost:
            found.append(f"{self.lost} requests lost under faults")
        if self.baseline_lost:
            found.append(f"{self.baseline_lost} requests lost without faults")
        if self.greedy_differ or self.seeded_differ:
            found.append(f"outputs differ from the no-fault run: {self.greedy_differ} greedy, "
                         f"{self.seeded_differ} seeded")
        for label, after in (("under faults", self.blocks_zero_after_s),
                             ("without faults", self.baseline_blocks_zero_after_s)):
            if after is None or after > self.blocks_bound_s:
                found.append(f"active blocks {label} not back to zero within {self.blocks_bound_s:g} s")
        if self.faults_not_recovered:
            found.append(f"{self.faults_not_recovered} workers not serving again after their fault")
        return tuple(found)

    @property
    def passed(self) -> bool:
        return not self.failures
