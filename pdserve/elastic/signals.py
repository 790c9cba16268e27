"""What the planner sees of each worker and of the fleet: the figures workers report in Stats, as
the router's pool holds them."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSignals:
    address: str
    role: str  # "prefill" | "decode"
    elastic: bool  # it can change role
    changing: bool  # a change of role is under way
    queued_prefill_tokens: int  # prompt tokens it still computes
    prefill_tokens_per_s: float  # its measured prefill speed (0: not known)
    running: int
    waiting: int
    free_blocks: int
    total_blocks: int
    step_s: float  # its recent steps' seconds
    awaiting_target: int = 0  # (prefill) started prompts whose decode blocks are not reserved yet

    @property
    def occupancy(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks if self.total_blocks else 0.0


@dataclass(frozen=True)
class FleetSignals:
    workers: tuple[WorkerSignals, ...]  # the usable ones, and those changing role

    def of_role(self, role: str) -> list[WorkerSignals]:
        return [w for w in self.workers if w.role == role and not w.changing]

    @property
    def changing(self) -> bool:
        return any(w.changing for w in self.workers)

    @property
    def prefill_backlog_s(self) -> float:
        """Seconds the prefill workers need for the prompt tokens queued there, at their measured
        speeds together (inf without a prefill worker; 0 without a speed known yet)."""
        prefill = self.of_role("prefill")
        if not prefill:
            return math.inf
        speed = sum(w.prefill_tokens_per_s for w in prefill)
        queued = sum(w.queued_prefill_tokens for w in prefill)
        return queued / speed if speed > 0 else 0.0

    @property
    def decode_waiting(self) -> int:
        """Requests waiting for decode blocks: queued on a decode worker for their reservation, or
        started on a prefill worker that holds their KV until it is reserved (a reservation taken
        when the prefill starts: they wait for it there)."""
        return sum(w.waiting for w in self.of_role("decode")) + sum(w.awaiting_target for w in self.of_role("prefill"))

    @property
    def decode_occupancy(self) -> float:
        """The share of the decode workers' KV blocks in use (all of them together)."""
        decode = self.of_role("decode")
        total = sum(w.total_blocks for w in decode)
        return 1.0 - sum(w.free_blocks for w in decode) / total if total else 0.0

    @property
    def decode_step_s(self) -> float:
        return max((w.step_s for w in self.of_role("decode")), default=0.0)
