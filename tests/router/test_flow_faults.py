"""A fault at every point a request passes on a worker: the stream ends with a defined outcome
(resumed or retried with the same tokens, or a clear status) and no fake worker holds a block."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pdserve.rpc.errors import Unavailable
from router.fleet.breaker import BreakerState
from router.flow.flow_types import FlowConfig
from tests.router.fake_workers import DECODE_POINTS, PREFILL_POINTS, Mode, Trigger
from router.flow.recovery import RequestPoisoned
from tests.helpers.waiting import async_wait_until
from tests.router.flow_harness import collect, expected, harness, job, settle

pytestmark = pytest.mark.timeout(60)

MODES = (Mode.KILL, Mode.STALL, Mode.SLOW, Mode.FAIL)
CASES = ([("d0", p, m) for p in DECODE_POINTS for m in MODES]
         + [("p0", p, m) for p in PREFILL_POINTS for m in (*MODES, Mode.PARTITION)])


def _on_workers(h, address: str):
    """Pin the first placement: the other worker of the role looks busier."""
    for w in h.pool.workers.values():
        if w.role == h.pool.workers[address].role and w.address != address:
            w.assigned, w.running = 1, 9


@pytest.mark.parametrize("address,point,mode", CASES, ids=[f"{a}-{p}-{m.value}" for a, p, m in CASES])
def test_a_fault_at_every_point_ends_with_the_full_output_and_no_block_held(address, point, mode):
    async def main():
        async with harness() as h:
            _on_workers(h, address)
            h.fleet.triggers.append(Trigger(address, point, mode, seconds=0.6))
            tokens, done, milestones = await collect(h.flow, job())
            _on_workers_reset(h)
            assert h.fleet.triggers[0].fired
            assert tokens == expected() and done is not None, milestones
            if mode in (Mode.KILL, Mode.STALL, Mode.FAIL) or (mode == Mode.PARTITION and point != "written"):
                assert {"retry", "resume", "complete"} & set(milestones)
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def _on_workers_reset(h) -> None:
    for w in h.pool.workers.values():
        w.assigned, w.running = 0, 0


def test_a_partition_is_charged_to_the_decode_worker_not_the_prefill_worker():
    async def main():
        async with harness(prefill=("p0",)) as h:
            charged, charge = [], h.pool.charge
            h.pool.charge = lambda address: (charged.append(address), charge(address))
            h.fleet.partitions.add(("p0", "d0"))
            _on_workers(h, "d0")
            tokens, _, milestones = await collect(h.flow, job())
            assert tokens == expected() and "retry" in milestones
            assert charged == ["d0"]

    asyncio.run(main())


def test_a_request_that_fails_inside_every_worker_fails_alone():
    async def main():
        async with harness() as h:
            for address in ("d0", "d1"):
                h.fleet.triggers.append(Trigger(address, "token", Mode.FAIL))
            with pytest.raises(RequestPoisoned):
                await collect(h.flow, job("poison"))
            assert all(w.breaker.state == BreakerState.CLOSED for w in h.pool.workers.values())
            tokens, _, _ = await collect(h.flow, job("next"))
            assert tokens == expected()
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_a_killed_worker_leaves_rotation_and_many_requests_all_finish():
    async def main():
        async with harness() as h:
            h.fleet.triggers.append(Trigger("d0", "token", Mode.KILL))
            jobs = [job(f"r{i}") for i in range(20)]
            results = await asyncio.gather(*(collect(h.flow, j) for j in jobs))
            assert all(tokens == expected() for tokens, _, _ in results)
            await async_wait_until(lambda: "d0" not in [w.address for w in h.pool.of_role("decode")], 30,
                                   "d0 out of rotation")
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_a_request_waits_for_a_worker_to_come_back_within_its_deadline():
    async def main():
        async with harness(decode=("d0",), wait_for_worker_s=30.0) as h:
            h.fleet.workers["d0"].kill()
            await async_wait_until(lambda: not h.pool.of_role("decode"), 30, "d0 out of rotation")
            asyncio.get_running_loop().call_later(0.3, h.fleet.workers["d0"].restart)
            tokens, _, _ = await collect(h.flow, job())
            assert tokens == expected()

    asyncio.run(main())


def test_no_worker_within_the_wait_is_unavailable():
    async def main():
        async with harness(decode=("d0",), wait_for_worker_s=0.3) as h:
            h.fleet.workers["d0"].kill()
            await async_wait_until(lambda: not h.pool.of_role("decode"), 30, "d0 out of rotation")
            with pytest.raises(Unavailable) as refused:
                await collect(h.flow, job())
            assert refused.value.retry_after_s == FlowConfig().no_worker_retry_after_s  # a hint to try again

    asyncio.run(main())


def test_a_cancelled_request_leaves_no_block_at_any_point():
    async def main():
        async with harness() as h:
            for delay in (0.0, 0.003, 0.01, 0.02, 0.04):
                task = asyncio.ensure_future(collect(h.flow, job(f"c{delay}")))
                await asyncio.sleep(delay)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_the_only_prefill_worker_stalled_the_request_waits_for_it_and_finishes():
    async def main():
        async with harness(prefill=("p0",)) as h:
            h.fleet.triggers.append(Trigger("p0", "chunk", Mode.STALL, seconds=1.0))
            tokens, _, milestones = await collect(h.flow, job())
            assert tokens == expected() and "retry" in milestones
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


LOCAL_POINTS = ("open", "token", "last")  # a decode worker prefilling itself never reserves
LOCAL_CASES = [(p, m) for p in LOCAL_POINTS for m in MODES]


@pytest.mark.parametrize("point,mode", LOCAL_CASES, ids=[f"d0-{p}-{m.value}" for p, m in LOCAL_CASES])
def test_a_fault_on_a_decode_worker_prefilling_from_its_cache_ends_with_the_full_output(point, mode):
    """Conditional disaggregation: d0 holds most of the prompt, so it prefills the rest itself;
    a fault there still ends with every token once and no block held anywhere."""
    from tests.router.flow_harness import PROMPT

    async def main():
        async with harness() as h:
            _on_workers(h, "d0")
            h.fleet.workers["d0"].cached[tuple(PROMPT[:-1])] = len(PROMPT) - 1
            h.fleet.triggers.append(Trigger("d0", point, mode, seconds=0.6))
            tokens, done, milestones = await collect(h.flow, job())
            _on_workers_reset(h)
            assert h.fleet.triggers[0].fired
            assert tokens == expected() and done is not None, milestones
            if mode == Mode.SLOW:
                assert done.local_prefill  # no fault: the cached worker prefilled it to the end
            else:
                assert {"retry", "resume", "complete"} & set(milestones)
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_a_stalled_decode_probe_counts_as_nothing_cached_and_the_request_goes_on():
    from tests.router.flow_harness import PROMPT

    async def main():
        async with harness() as h:
            for w in h.fleet.workers.values():
                w.cached[tuple(PROMPT[:-1])] = len(PROMPT) - 1
            h.fleet.triggers.append(Trigger("d1", "open", Mode.STALL, seconds=0.6))
            h.fleet.workers["d1"].running.clear()  # stalled: its MatchPrefix does not answer
            _on_workers(h, "d0")
            tokens, done, _ = await collect(h.flow, job())
            h.fleet.workers["d1"].running.set()
            assert tokens == expected() and done is not None
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())


def test_every_attempt_carries_the_requests_age_so_a_resume_keeps_its_place(monkeypatch):
    """A resume reaches its new decode and prefill workers as old as the request: the age the
    router has counted since it accepted it, not since the attempt began."""
    from dataclasses import replace

    from tests.router.fake_fleet import FakeDecodeClient, FakePrefillClient

    ages: list[tuple[str, int, float]] = []
    for cls, role in ((FakeDecodeClient, "decode"), (FakePrefillClient, "prefill")):
        def recording(self, worker_job, *args, _open=cls.open, _role=role):
            ages.append((_role, len(worker_job.output_token_ids), worker_job.age_s))
            return _open(self, worker_job, *args)
        monkeypatch.setattr(cls, "open", recording)

    async def main():
        async with harness() as h:
            _on_workers(h, "d0")
            h.fleet.triggers.append(Trigger("d0", "token", Mode.KILL))
            fresh = job()
            old = replace(fresh, accepted=fresh.accepted - 50.0)  # accepted 50 s ago
            tokens, _, milestones = await collect(h.flow, old)
            assert tokens == expected() and "resume" in milestones
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())
    resumed = [(role, age) for role, generated, age in ages if generated]
    assert {role for role, _ in resumed} == {"decode", "prefill"}
    assert all(age >= 50.0 for _, _, age in ages)
    assert min(age for _, age in resumed) >= max(age for _, generated, age in ages if not generated)


def test_a_fault_during_a_resume_resumes_again():
    """The decode worker dies mid-stream; the resume's prefill worker then stalls: the request
    resumes once more (a fault in a resume's prefill is not a protocol error) and completes."""
    async def main():
        async with harness(prefill=("p0",)) as h:
            _on_workers(h, "d0")
            stall = Trigger("p0", "chunk", Mode.STALL, seconds=0.5)  # armed by the kill: the resume's prefill
            h.fleet.triggers.append(Trigger("d0", "token", Mode.KILL, then=stall))
            tokens, _, milestones = await asyncio.wait_for(collect(h.flow, job()), 20)
            assert stall.fired
            assert tokens == expected() and milestones.count("resume") == 2
            assert not any((await settle(h.fleet)).values())

    asyncio.run(main())
