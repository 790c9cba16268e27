"""Canaries through every prefill-decode pair: a pair that answers other than the majority leaves
rotation (no request is placed on it) and comes back once it agrees again; a canary is pinned to
its pair (never retried elsewhere) and is a BATCH request."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.requests import Priority
from router.fleet.canary import Canaries, CanaryConfig
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)
PROMPT = tuple(range(3, 17))


def _canaries(h, outcomes: list[str]) -> Canaries:
    return Canaries(h.pool, h.flow, PROMPT, CanaryConfig(interval_s=None, max_tokens=6), outcomes.append)


def test_a_pair_answering_wrong_leaves_rotation_and_comes_back():
    async def main():
        async with harness(decode=("d0", "d1", "d2")) as h:
            outcomes: list[str] = []
            canaries = _canaries(h, outcomes)
            h.fleet.workers["d1"].skew = 1  # d1 computes wrong: both pairs through it answer otherwise
            answers = await canaries.round()
            assert set(answers) == {(p, d) for p in ("p0", "p1") for d in ("d0", "d1", "d2")}
            assert h.pool.quarantined == {("p0", "d1"), ("p1", "d1")}
            assert outcomes.count("differ") == 2 and outcomes.count("agree") == 4
            for i in range(6):  # every request goes through a pair still in rotation
                tokens, _, _ = await collect(h.flow, job(f"r{i}"))
                assert tokens == expected()
            assert h.fleet.workers["d1"].opened == 2  # its two canaries, nothing else
            h.fleet.workers["d1"].skew = 0  # repaired
            await canaries.round()
            assert not h.pool.quarantined
            assert set((await settle(h.fleet)).values()) == {0}

    asyncio.run(main())


def test_without_a_majority_nothing_is_judged_and_a_failing_pair_is_not_retried_elsewhere():
    async def main():
        async with harness(prefill=("p0",)) as h:
            outcomes: list[str] = []
            canaries = _canaries(h, outcomes)
            h.fleet.workers["d1"].skew = 1  # one pair of two answers otherwise: no majority either way
            await canaries.round()
            assert canaries.reference is None and not h.pool.quarantined and outcomes == ["unjudged"] * 2
            h.fleet.workers["d1"].skew = 0
            h.fleet.workers["d0"].kill()
            answers = await canaries.round()  # d0 is down at once: its pair is not usable, d1 answers
            assert canaries.reference is not None and not h.pool.quarantined
            assert h.fleet.workers["d0"].opened <= 1 and list(answers) in ([("p0", "d1")], [("p0", "d0"), ("p0", "d1")])

    asyncio.run(main())


def test_a_canary_is_a_batch_request_pinned_to_its_pair(monkeypatch):
    from tests.router.fake_fleet import FakeDecodeClient

    seen = []
    original = FakeDecodeClient.open

    def recording(self, worker_job, local):
        seen.append((self.address, worker_job.priority, local))
        return original(self, worker_job, local)

    monkeypatch.setattr(FakeDecodeClient, "open", recording)

    async def main():
        async with harness() as h:
            await _canaries(h, []).round()

    asyncio.run(main())
    assert sorted(a for a, _, _ in seen) == ["d0", "d0", "d1", "d1"]
    assert {p for _, p, _ in seen} == {Priority.BATCH} and not any(local for _, _, local in seen)
