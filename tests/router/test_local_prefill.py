"""Conditional disaggregation and conversation-aware decode placement, as policies."""

from __future__ import annotations

from router.placement.local_prefill import LocalPrefillPolicy
from router.placement.placement import choose_decode
from router.fleet.workers import Worker


def _w(address: str, assigned: int = 0, waiting: int = 0, role: str = "decode") -> Worker:
    return Worker(address, role, ready=True, free_blocks=100, assigned=assigned, waiting=waiting)


IDLE_DECODE = _w("d")


def test_a_mostly_cached_prompt_with_a_short_remainder_stays_on_the_decode_worker():
    policy = LocalPrefillPolicy(max_uncached_tokens=256, min_cached_fraction=0.5)
    assert policy.decide(1000, 900, IDLE_DECODE, [_w("p", role="prefill")]).reason == "cached"
    assert policy.decide(1000, 700, IDLE_DECODE, [_w("p", role="prefill")]).reason == "remote"  # 300 uncached
    assert policy.decide(200, 50, IDLE_DECODE, [_w("p", role="prefill")]).reason == "remote"  # mostly new
    assert not LocalPrefillPolicy(max_uncached_tokens=0).decide(1000, 999, IDLE_DECODE, []).local


def test_a_busy_decode_worker_sends_its_cached_remainder_to_an_idle_prefill_worker_holding_as_much():
    policy = LocalPrefillPolicy(busy_decode_requests=4, max_uncached_tokens=256)
    busy = Worker("d", "decode", ready=True, running=4)
    idle_prefill, queued_prefill = _w("p1", role="prefill"), _w("p2", assigned=1, role="prefill")
    holds = {"p1": 800, "p2": 900}
    assert policy.wants_prefill_probe(1000, 900, busy) and policy.idle([queued_prefill, idle_prefill]) == [idle_prefill]
    assert policy.decide(1000, 900, busy, [queued_prefill, idle_prefill], holds).reason == "decode_busy"
    assert policy.decide(1000, 900, busy, [idle_prefill], {"p1": 700}).reason == "cached"  # 300 to compute there
    assert policy.decide(1000, 900, busy, [idle_prefill]).reason == "cached"  # it holds nothing of the prompt
    assert policy.decide(1000, 900, busy, [queued_prefill], holds).reason == "cached"  # no prefill worker is idle
    assert policy.decide(1000, 900, _w("d", assigned=3), [idle_prefill], holds).reason == "cached"  # not busy yet
    assert not policy.wants_prefill_probe(1000, 900, _w("d", assigned=3))
    assert policy.decide(1000, 900, _w("d", assigned=4), [idle_prefill], holds).reason == "decode_busy"
    assert LocalPrefillPolicy(busy_decode_requests=0).decide(1000, 900, busy, [idle_prefill], holds).reason == "cached"


def test_a_short_prompt_stays_local_only_while_every_prefill_worker_is_busy():
    policy = LocalPrefillPolicy(busy_prefill_requests=4)
    busy, idle = _w("p1", assigned=4, role="prefill"), _w("p2", waiting=1, role="prefill")
    d = IDLE_DECODE
    assert policy.decide(100, 0, d, [busy, _w("p3", waiting=5, role="prefill")]).reason == "prefill_busy"
    assert policy.decide(100, 0, d, [busy, idle]).reason == "remote"
    assert policy.decide(1000, 0, d, [busy]).reason == "remote"  # too long to compute on the decode worker
    assert LocalPrefillPolicy(busy_prefill_requests=0).decide(100, 0, d, [busy]).reason == "remote"


def test_decode_placement_follows_the_cache_within_a_load_slack():
    a, b, c = _w("a", assigned=3), _w("b", assigned=0), _w("c", assigned=6)
    assert choose_decode([a, b, c], {"a": 512, "b": 0, "c": 1024}, slack=4).address == "a"  # c is too loaded
    assert choose_decode([a, b, c], {}, slack=4).address == "b"  # no cache anywhere: the least loaded
    assert choose_decode([a, b, c], {"c": 1024}, avoid={"b"}, slack=10).address == "c"


def test_a_busy_decode_worker_holding_the_conversation_gives_its_rest_to_a_prefill_worker_holding_it_too():
    """Through the flow: d0 holds the prompt but is busy; an idle prefill worker that also holds it
    computes the rest (d0 receives only what it lacks); one that holds nothing leaves it on d0."""
    import asyncio
    import dataclasses

    from router.flow.flow import RequestFlow
    from tests.router.flow_harness import PROMPT, collect, expected, harness, job, settle

    policy = LocalPrefillPolicy(max_uncached_tokens=16, busy_decode_requests=4)  # 40 tokens: too many to compute

    async def run(prefill_holds: bool):
        async with harness() as h:
            h.fleet.workers["d0"].cached[tuple(PROMPT[:-1])] = len(PROMPT) - 1
            if prefill_holds:
                h.fleet.workers["p1"].cached[tuple(PROMPT[:-1])] = len(PROMPT) - 1
            h.pool.workers["d0"].assigned += 4  # busy: four requests of this router in flight there
            flow = RequestFlow(h.pool, h.fleet, dataclasses.replace(h.flow.config, local_prefill=policy))
            try:
                tokens, done, milestones = await collect(flow, job())
            finally:
                h.pool.workers["d0"].assigned -= 4
            assert tokens == expected() and done is not None
            assert not any((await settle(h.fleet)).values())
            return done.local_prefill, "placement.prefill" in milestones

    assert asyncio.run(run(prefill_holds=True)) == (False, True)
    assert asyncio.run(run(prefill_holds=False)) == (True, False)
