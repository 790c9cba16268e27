"""Where one attempt of a request runs: its decode worker (the longest cached prefix of it within
a load slack), whether that worker prefills it itself (router/placement/local_prefill.py), and its prefill
worker. The choices are policies (router/placement/placement.py, router/placement/local_prefill.py); this file asks
the workers what they hold (MatchPrefix probes, concurrently) and waits for usable ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from pdserve.rpc.errors import Unavailable
from router.fleet.clients import WorkerClients
from router.fleet.workers import Worker, WorkerPool
from router.flow.flow_types import FlowConfig, FlowState, Job, ReserveAt
from router.placement.local_prefill import RESUME_REMOTE, LocalPrefillDecision
from router.placement.observed import Observed
from router.placement.placement import NoWorker, choose_decode
from router.placement.predicting import Predictor

MOVE_GAIN_S = 1.0  # the least a move of a queued prefill must be predicted to save


MIN_WAIT_S = 0.5  # a retry's least wait for a usable worker, however old the request


class Placer:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, config: FlowConfig, observed: Observed):
        self.pool = pool
        self.clients = clients
        self.config = config
        self.predictor = Predictor(pool, observed, self.cached_prefixes,
                                   late_reservation=config.reserve_at is ReserveAt.PREFILL)

    async def decode(self, job: Job, state: FlowState) -> tuple[Worker, int]:
        """The decode worker, and how much of the prompt (with the tokens out so far) it holds."""
        workers = await self.pool.wait_usable("decode", self.wait_until(job, state),
                                              paired=not self.config.colocated)
        prompt = (*job.prompt, *state.generated)
        local_rule = not self.config.colocated and self.config.local_prefill.max_uncached_tokens > 0
        moved_to, state.move_to = next((w for w in workers if w.address == state.move_to), None), None
        if moved_to is not None:  # the worker a move chose, while it is usable
            cached = await self.cached_prefixes("decode", prompt, [moved_to], always=local_rule)
            self.claim(state, moved_to)
            return moved_to, cached.get(moved_to.address, 0)
        avoid = state.avoided("decode", workers)
        failed = avoid & {fault.address for fault in state.faults}  # not merely departed from
        probed = [w for w in workers if w.address not in avoid] or workers
        cached = await self.cached_prefixes("decode", prompt, probed, always=local_rule)
        try:
            decode = choose_decode(workers, cached, avoid, failed=failed)
        except NoWorker as exc:
            raise self.none_usable(exc) from None
        self.claim(state, decode)
        return decode, cached.get(decode.address, 0)

    @staticmethod
    def claim(state: FlowState, decode: Worker) -> None:
        """The request counts on `decode` from its choice on (its prefill and admission take awaits,
        in which others choose too), in place of any earlier choice of it."""
        Placer.release(state)
        decode.claimed += 1
        state.claim = decode

    @staticmethod
    def release(state: FlowState) -> None:
        """Its claim ends: its call opened (counted as assigned from there), or the attempt ended first."""
        if state.claim is not None:
            state.claim.claimed -= 1
            state.claim = None

    def pinned(self, pin: tuple[str, str]) -> tuple[Worker, Worker]:
        """The (decode, prefill) workers of a pinned pair, while both are usable and pair; else
        Unavailable at once (a canary of a pair tries that pair or nothing)."""
        prefill_address, decode_address = pin
        decode = next((w for w in self.pool.of_role("decode") if w.address == decode_address), None)
        prefill = next((w for w in self.pool.of_role("prefill") if w.address == prefill_address), None)
        if decode is None or prefill is None or not prefill.pairs_with(decode):
            raise Unavailable(f"the pair {prefill_address} -> {decode_address} is not usable now")
        return decode, prefill

    def beside(self, address: str) -> Worker | None:
        """The decode worker at `address` while it is usable (a sample placed beside its first)."""
        return next((w for w in self.pool.of_role("decode") if w.address == address), None)

    async def local_prefill(self, job: Job, state: FlowState, decode: Worker, cached: int) -> LocalPrefillDecision:
        """Colocated, or the policy's call over the prompt and the tokens out so far; a remote
        prefill first waits for a usable prefill worker (no decode blocks are reserved while none
        could fill them). A resume goes through the prefill pool, whose prefix cache still holds
        its prompt, unless none is usable now: then its decode worker prefills it, at once."""
        if self.config.colocated:
            return LocalPrefillDecision(True, "colocated")
        policy, prompt = self.config.local_prefill, (*job.prompt, *state.generated)
        prefill = self.pool.of_role("prefill", decode)
        if state.generated and not prefill:
            return LocalPrefillDecision(True, "resume")
        if not prefill and self.pool.cut_off(decode):
            return LocalPrefillDecision(True, "link_out")
        prefill_cached: Mapping[str, int] = {}
        if policy.wants_prefill_probe(len(prompt), cached, decode):
            prefill_cached = await self.cached_prefixes("prefill", prompt, policy.idle(prefill), always=True)
        decision = policy.decide(len(prompt), cached, decode, prefill, prefill_cached)
        if not decision.local:
            await self.pool.wait_usable("prefill", self.wait_until(job, state), decode)
            if state.generated:
                return RESUME_REMOTE
        return decision

    async def prefill(self, job: Job, state: FlowState, decode: Worker, planned: Worker | None) -> Worker:
        """`planned` (chosen at admission) while it is still usable; else the earliest predicted
        first token among the usable prefill workers now (router/placement/predicting.py)."""
        if job.pin is not None:
            return self.pinned(job.pin)[1]
        workers = await self.pool.wait_usable("prefill", self.wait_until(job, state), decode)
        if planned is not None and any(w is planned for w in workers) and planned.address not in state.avoided("prefill", workers):
            return planned
        try:
            return (await self.predictor.remote(job, state, decode))[0]
        except NoWorker as exc:
            raise self.none_usable(exc) from None

    def roomier_decode(self, job: Job, state: FlowState, current: Worker, block_size: int) -> Worker | None:
        """A usable decode worker other than `current` (and pairing with it: the request's KV may
        move there) that could reserve the request's blocks at once by its last poll (none
        waiting there, enough free blocks), the freest first; None if no such worker."""
        workers = self.pool.of_role("decode", current)
        avoid = state.avoided("decode", workers)
        need = -(-(len(job.prompt) + len(state.generated)) // block_size)
        roomy = [w for w in workers if w is not current and w.address not in avoid and w.waiting == 0
                 and w.free_blocks >= need]
        return max(roomy, key=lambda w: (w.free_blocks, -w.assigned), default=None)

    def sooner_prefill(self, job: Job, state: FlowState, current: Worker, decode: Worker) -> Worker | None:
        """A usable prefill worker pairing with `decode` predicted to give the first token in under
        half of what is queued on `current` (the request included), and at least MOVE_GAIN_S
        sooner; None if none."""
        remaining = self.predictor.on(job, state, current).queue_s
        workers = self.pool.of_role("prefill", decode)
        avoid = state.avoided("prefill", workers)
        options = [(self.predictor.on(job, state, w).total_s, w)
                   for w in workers if w is not current and w.address not in avoid]
        if not options:
            return None
        seconds, best = min(options, key=lambda o: o[0])
        return best if seconds < remaining / 2 and remaining - seconds >= MOVE_GAIN_S else None

    def none_usable(self, exc: NoWorker) -> Unavailable:
        """UNAVAILABLE once the wait for a usable worker is over, with a retry hint."""
        return Unavailable(str(exc), self.config.no_worker_retry_after_s)

    def wait_until(self, job: Job, state: FlowState) -> float:
        """When to stop waiting for a usable worker: a request with nothing out yet waits
        `wait_for_worker_s` from its arrival (at least MIN_WAIT_S now), so a client whose workers are
        unreachable hears UNAVAILABLE in seconds and can go elsewhere; one with tokens out (a
        resume) waits `resume_wait_s`, long enough for a restart. Never past the deadline."""
        config = self.config
        wait = config.resume_wait_s if state.generated else max(config.wait_for_worker_s - job.age_s(), MIN_WAIT_S)
        until = time.monotonic() + wait
        return until if job.deadline is None else min(until, job.deadline)

    async def cached_prefixes(self, role: str, prompt: tuple[int, ...], workers: list[Worker],
                              always: bool = False) -> dict[str, int]:
        """MatchPrefix of each worker (concurrently); with one worker only when `always`."""
        if len(workers) < (1 if always else 2):
            return {}
        client = self.clients.decode if role == "decode" else self.clients.prefill
        counts = await asyncio.gather(*(client(w.address).match_prefix(prompt, self.config.probe_timeout_s)
                                        for w in workers))
        return {w.address: n for w, n in zip(workers, counts) if n is not None}
