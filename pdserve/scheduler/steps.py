"""The steps a schedule() composes: priority preemption, decodes, prefill chunks and admission.

Each step appends to the StepPlan. Prefill work is one stream in (rank, group, entered) order:

    running prefills ─┐
    swapped          ─┤
    resuming         ─┼─ merge ─> continue a chunk | swap in | reserve (remote) | admit + chunk
    waiting          ─┘           no queued request passes one that cannot start (no budget, no
                                  blocks); running prefills behind it still continue, since they
                                  hold blocks it may be waiting for
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator

from pdserve.kv.block_pool import Allocated, OutOfBlocks
from pdserve.kv.manager import KVManager, SwapPlan
from pdserve.requests import Request, RequestState
from pdserve.scheduler.chunking import ChunkPolicy
from pdserve.scheduler.guard import VipReserve
from pdserve.scheduler.plan import StepPlan
from pdserve.scheduler.preemptor import HIGHER_PRIORITY_WAITING, Preemptor
from pdserve.scheduler.queue import Candidate, Group
from pdserve.scheduler.results import Reservation
from pdserve.scheduler.slicing import SlicePolicy
from pdserve.scheduler.state import Queues
from pdserve.scheduler.victims import Claim

ALL_GROUPS = (Group.RUNNING, Group.SWAPPED, Group.WAITING)
_RUNNING = RequestState.RUNNING


class Steps:
    def __init__(self, kv: KVManager, queues: Queues, preemptor: Preemptor, chunking: ChunkPolicy,
                 guard: VipReserve, slices: SlicePolicy):
        self._kv = kv
        self._slices = slices
        self._guard = guard
        self._q = queues
        self._preemptor = preemptor
        self._chunking = chunking

    def observe(self, chunks, seconds: float) -> None:
        """A step of `chunks` took `seconds`: for a chunk policy that learns from it."""
        self._chunking.observe(chunks, seconds)

    def predicted_s(self, chunks) -> float | None:
        return self._chunking.predicted_s(chunks)

    def reserve_blocks(self, plan: StepPlan) -> int:
        """Blocks an admission must leave: the watermark for running decodes' growth (none when
        nothing runs), plus this step's growth when decodes are scheduled after admissions."""
        watermark = self._kv.watermark_blocks if self._q.running or self._q.receiving else 0
        return watermark + plan.growth_reserve

    def reserve_decode_growth(self, plan: StepPlan) -> None:
        """For policies that admit before decoding: keep the blocks this step's decodes grow
        into, so an admission or swap-in cannot take them (and be preempted right after)."""
        decodes, i = self._decodes(plan), 0
        while i < len(decodes):
            i += len(self._kv.tables_with_room(decodes, i, len(decodes)))
            if i < len(decodes):
                plan.growth_reserve += 1  # a decode grows by one block at most
                i += 1

    def decoding(self) -> bool:
        return len(self._q.running) > len(self._q.prefilling)

    def decodes(self, plan: StepPlan) -> None:
        """One token for every running decode, best class first, while the budget lasts.
        NOTE: the hot loop of a step. The decodes whose tables have room need no allocation:
        they come in runs from one KV query; only one that needs a block goes through the
        preemptor (which may preempt decodes further on: those are skipped)."""
        decodes, i = self._decodes(plan), 0
        while i < len(decodes) and plan.budget_left >= 1:
            tables = self._kv.tables_with_room(decodes, i, plan.budget_left)
            plan.add_decodes(decodes, i, tables)
            i += len(tables)
            if i < len(decodes) and plan.budget_left >= 1:
                preempted = len(plan.preempted)
                self._grow(plan, decodes[i])
                i += 1
                if len(plan.preempted) > preempted:
                    decodes[i:] = [r for r in decodes[i:] if r.state is _RUNNING]

    def _decodes(self, plan: StepPlan) -> list[Request]:
        """Running decodes not yet in this step, in running order."""
        skip = plan.touched.union(self._q.prefilling) if plan.touched else self._q.prefilling
        return [r for r in self._q.running if r.request_id not in skip] if skip else list(self._q.running)

    def _grow(self, plan: StepPlan, request: Request) -> None:
        result = self._preemptor.allocate(plan, request, 1)
        if isinstance(result, Allocated):
            plan.add_chunk(request, 1, result.blocks)

    def prefills(self, plan: StepPlan, groups: Collection[Group] = ALL_GROUPS) -> None:
        running = self._running_prefills(plan) if Group.RUNNING in groups else []
        for cand in heapq.merge(running, self._admissions(plan, groups)):
            if cand.group != Group.RUNNING and not self._q.has_slot():
                break
            if not self._handle(plan, cand):
                if cand.group == Group.RUNNING:
                    return  # no blocks for it even by preemption: none for anything after it
                break  # nothing queued passes a queued request that cannot start; running prefills go on
        for cand in running:
            if cand.request.request_id not in plan.touched and cand.request.state == RequestState.RUNNING \
                    and not self._continue(plan, cand.request):
                return

    def priority_preemption(self, plan: StepPlan) -> None:
        """Before decodes take their blocks: make room for the best prefill, running or queued, by
        preempting lower classes (lowest, latest first) and, where it claims a time slice
        (slicing.py), running requests of its own class that have had theirs."""
        if not self._q.running:
            return
        queued = self._queued(plan, (Group.SWAPPED, Group.WAITING))
        head = next(heapq.merge(self._running_prefills(plan), queued), None)
        if head is None:
            return
        claim = Claim(head.rank, head.request.priority)
        lower = claim.over(self._q.order.lane(self._q.running[-1]), self._q.running[-1].priority) \
            and not self._preemptor.known_unclaimed(claim)
        slicing = self._slices.claims(head, plan.now)
        if not (lower or slicing):
            return
        need = self._blocks_to_start(head, plan)
        if not slicing and (self._fits(plan, head, need) or not self._guard.allows(head.request)):
            return
        while not (self._fits(plan, head, need) and self._guard.allows(head.request)):
            if not self._take_one(plan, head, claim if lower else None, slicing):
                return

    def _take_one(self, plan: StepPlan, head: Candidate, claim: Claim | None, slicing: bool) -> bool:
        """Preempt one request for `head`: of a lower class while that can help (the VIP guard
        counts VIPs alone), else, with a slice, of its own class. False: nobody."""
        if claim is not None and self._guard.allows(head.request):
            victim = self._preemptor.pick(plan, claim)
            if victim is not None:
                self._preemptor.preempt(plan, victim, HIGHER_PRIORITY_WAITING)
                return True
        victim = self._slices.pick(head, self._q.running, plan.touched, self._q.admission, plan.now) \
            if slicing else None
        if victim is not None:
            self._preemptor.slice_out(plan, victim)
        return victim is not None

    def _fits(self, plan: StepPlan, head: Candidate, blocks: int) -> bool:
        if head.group == Group.RUNNING:
            return blocks <= self._kv.num_available
        return self._q.has_slot() and blocks + self.reserve_blocks(plan) <= self._kv.num_available

    def _blocks_to_start(self, head: Candidate, plan: StepPlan) -> int:
        request = head.request
        if head.group == Group.RUNNING:
            return self._kv.num_new_blocks(request, self._chunk_size(plan, request, request.num_computed_tokens))
        if request.state == RequestState.SWAPPED:
            return self._kv.swap_in_cost(request.request_id)
        if request.request_id in self._q.remote:
            match = self._kv.match_prompt(request)
            return self._kv.admission_cost(match, request.num_remote_tokens - match.num_tokens)
        match = self._kv.match(request)
        n = self._chunking.size(request.num_tokens - match.num_tokens, match.num_tokens, plan)
        return self._kv.admission_cost(match, n)

    def _running_prefills(self, plan: StepPlan) -> list[Candidate]:
        """Running requests with more than one token to compute, in (rank, entered) order;
        found once per step (requests preempted later in the step are skipped when met)."""
        if plan.prefilling is None:
            plan.prefilling = sorted(self._q.running_prefill(r, plan.now) for r in self._q.prefilling.values())
        return plan.prefilling

    def _admissions(self, plan: StepPlan, groups: Collection[Group]) -> Iterator[Candidate]:
        return self._queued(plan, groups) if self._q.has_slot() else iter(())

    def _queued(self, plan: StepPlan, groups: Collection[Group]) -> Iterator[Candidate]:
        """SWAPPED in `groups` takes the swapped queue, WAITING the waiting one (its RESUMING
        streams included)."""
        queues = [(Group.SWAPPED, self._q.swapped), (Group.WAITING, self._q.waiting)]
        return heapq.merge(*(q.candidates(plan.now) for g, q in queues if g in groups and len(q)))

    def _handle(self, plan: StepPlan, cand: Candidate) -> bool:
        """False: this candidate cannot proceed, and neither may anything after it."""
        request = cand.request
        if request.request_id in plan.touched:
            return request.state == RequestState.RUNNING  # a victim of this step keeps its place
        if cand.group == Group.RUNNING:
            return self._continue(plan, request)
        if not self._guard.allows(request):
            return True
        if request.state == RequestState.SWAPPED:  # a time slice's victim queues as resuming
            return self._swap_in(plan, request)
        if request.request_id in self._q.remote:
            return self._reserve(plan, request)
        return self._admit(plan, request)

    def _continue(self, plan: StepPlan, request: Request) -> bool:
        n = self._chunk_size(plan, request, request.num_computed_tokens)
        return n > 0 and self._chunk(plan, request, n)

    def _chunk_size(self, plan: StepPlan, request: Request, computed: int) -> int:
        return self._chunking.size(request.num_tokens - computed, computed, plan)

    def _chunk(self, plan: StepPlan, request: Request, n: int) -> bool:
        result = self._preemptor.allocate(plan, request, n)  # tries a plain allocation first
        if isinstance(result, OutOfBlocks):
            return False
        plan.add_chunk(request, n, result.blocks)
        return True

    def _swap_in(self, plan: StepPlan, request: Request) -> bool:
        result = self._kv.swap_in(request, self.reserve_blocks(plan))
        if not isinstance(result, SwapPlan):
            return False
        plan.swap_in.extend(result.pairs)
        self._q.admit(request, plan.now)
        plan.resumed.append(request)
        plan.touched.add(request.request_id)
        n = self._chunk_size(plan, request, request.num_computed_tokens)
        slots = self._kv.allocate_slots(request, n) if n > 0 else None
        if isinstance(slots, Allocated):
            plan.add_chunk(request, n, slots.blocks)
        return True

    def _reserve(self, plan: StepPlan, request: Request) -> bool:
        match = self._kv.match_prompt(request)
        result = self._kv.reserve(request, match, self.reserve_blocks(plan))
        if isinstance(result, OutOfBlocks):
            return False
        request.num_cached_tokens = match.num_tokens
        self._q.reserve(request, plan.now)
        plan.reserved.append(Reservation(request, result.blocks, match.num_tokens // self._kv.block_size))
        plan.touched.add(request.request_id)
        return True

    def _admit(self, plan: StepPlan, request: Request) -> bool:
        match = self._kv.match(request)
        n = self._chunk_size(plan, request, match.num_tokens)
        result = self._kv.admit(request, match, n, self.reserve_blocks(plan)) if n > 0 else None
        if not isinstance(result, Allocated):
            return False
        if request.admit_seq < 0:
            request.num_cached_tokens = match.num_tokens
        if request.num_preemptions:
            plan.resumed.append(request)
        request.num_computed_tokens = match.num_tokens
        self._q.admit(request, plan.now)
        plan.add_chunk(request, n, result.blocks)
        return True

