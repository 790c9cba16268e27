"""Preemption mechanism: allocate or make room by preempting victims the policies choose."""

from __future__ import annotations

from typing import NamedTuple

from pdserve.kv.block_pool import Allocated, Allocation, OutOfBlocks
from pdserve.kv.manager import KVManager, SwapPlan
from pdserve.requests import PreemptionMode, Request
from pdserve.scheduler.output import Preemption
from pdserve.scheduler.plan import StepPlan
from pdserve.scheduler.preemption_mode import PreemptionModePolicy
from pdserve.scheduler.state import Queues
from pdserve.scheduler.victims import Claim, VictimPolicy

OUT_OF_BLOCKS = "out_of_blocks"
HIGHER_PRIORITY_WAITING = "higher_priority_waiting"
TIME_SLICE = "time_slice"


class _Unclaimed(NamedTuple):
    claim: Claim  # no running request (not protected) may be preempted by this claim...
    epoch: int  # ...while Queues.running_epoch is still this


class Preemptor:
    def __init__(self, kv: KVManager, queues: Queues, victims: VictimPolicy, modes: PreemptionModePolicy):
        self._kv = kv
        self._q = queues
        self._victims = victims
        self._modes = modes
        self._unclaimed: _Unclaimed | None = None

    def allocate(self, plan: StepPlan, request: Request, num_new_tokens: int) -> Allocation:
        """Blocks for the request's next num_new_tokens, preempting victims while short. The
        request itself may be the victim (it is then no longer running), unless the blocks it
        lacks are only pinned by holds: then it waits, as they come back when transfers end."""
        result = self._kv.allocate_slots(request, num_new_tokens)
        return result if isinstance(result, Allocated) else self.make_room(plan, request, num_new_tokens, result)

    def make_room(self, plan: StepPlan, request: Request, num_new_tokens: int, short: OutOfBlocks) -> Allocation:
        """`allocate` after its plain allocation came back `short`."""
        while True:
            victim = self.pick(plan)
            if victim is None or (victim is request and short.needed <= short.available + self._kv.num_held_only()):
                return short
            self.preempt(plan, victim, OUT_OF_BLOCKS)
            if victim is request:
                return short
            result = self._kv.allocate_slots(request, num_new_tokens)
            if isinstance(result, Allocated):
                return result
            short = result

    def pick(self, plan: StepPlan, claim: Claim | None = None) -> Request | None:
        """The victim policy's choice. NOTE: once it finds nobody a claim may preempt with nobody
        running protected, that holds until a request joins `running`: a running request's rank
        is fixed at its admission, and leaving `running` removes candidates. So the step that
        finds every running request beyond the best waiting one's claim does not rescan them all."""
        if claim is not None and self.known_unclaimed(claim):
            return None
        victim = self._victims.pick(self._q.running, plan.touched, self._q.running_rank, claim)
        if victim is None and claim is not None and not any(r.request_id in plan.touched for r in self._q.running):
            self._unclaimed = _Unclaimed(claim, self._q.running_epoch)
        return victim

    def known_unclaimed(self, claim: Claim) -> bool:
        """True when pick(claim=claim) is known to find nobody."""
        known = self._unclaimed
        return known is not None and known.epoch == self._q.running_epoch and known.claim.covers(claim)

    def preempt(self, plan: StepPlan, victim: Request, reason: str) -> None:
        self._take_off(plan, victim, self._modes.choose(victim.num_computed_tokens, self._kv.host.num_free), reason)

    def slice_out(self, plan: StepPlan, victim: Request) -> None:
        """Preempt a time slice's victim (slicing.py): it queues behind its class's waiting streams."""
        mode = self._modes.choose_for_slice(victim.num_computed_tokens, self._kv.host.num_free)
        self._take_off(plan, victim, mode, TIME_SLICE)

    def _take_off(self, plan: StepPlan, victim: Request, mode: PreemptionMode, reason: str) -> None:
        if mode == PreemptionMode.SWAP:
            mode = self._swap_out(plan, victim)
        if mode == PreemptionMode.RECOMPUTE:
            self._kv.free(victim)
        self._q.preempt(victim, mode, plan.now, sliced=reason == TIME_SLICE)
        plan.touched.add(victim.request_id)
        plan.preempted.append(Preemption(victim, mode, reason))

    def _swap_out(self, plan: StepPlan, victim: Request) -> PreemptionMode:
        result = self._kv.swap_out(victim)
        if not isinstance(result, SwapPlan):
            return PreemptionMode.RECOMPUTE
        plan.swap_out.extend(result.pairs)
        return PreemptionMode.SWAP
