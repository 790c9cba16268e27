"""Two routers in front of one fake fleet, each with its own pool, flow and gateway: an Abort sent to
the router not running the request reaches it through the workers (router/doors/aborting.py), as its
tenant's only; one that overtakes its Generate ends that Generate at the other router at once; no
worker holds a block or a tombstone afterwards."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pdserve.requests import FinishReason
from pdserve.rpc.drain import Drain
from pdserve.tokenizer import load_tokenizer
from pdserve.v1 import generation_pb2 as pb
from pdserve.validation import Limits
from router.flow.flow import RequestFlow
from router.flow.flow_types import FlowConfig
from router.doors.frontend import Frontend
from router.doors.gateway import Gateway
from router.doors.servicer import WireAsk
from router.doors.tenants import read_tenants
from router.doors.tombstones import AbortOutcome
from router.fleet.workers import PoolConfig, WorkerPool
from tests.helpers.waiting import async_wait_until
from tests.router.fake_fleet import FakeFleet
from tests.router.fake_trace import FakeTrace
from tests.router.fake_workers import FleetConfig
from tests.router.flow_harness import settle

pytestmark = pytest.mark.timeout(120)

TENANTS = "tok-a tenant=a\ntok-b tenant=b\n"
HELD_TOKENS = 100_000  # a stream still running when the test acts on it, at any speed
POOL_BLOCKS = 2 * -(-(40 + HELD_TOKENS) // FleetConfig().block_size)  # two such streams on one fake worker
SHORT = 8


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


@contextlib.asynccontextmanager
async def two_routers(tokenizer, tenants_file):
    """Routers A and B over one fleet of 2 prefill + 2 decode fake workers."""
    fleet = FakeFleet(FleetConfig(blocks=POOL_BLOCKS))
    for address, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")):
        fleet.add(address, role)
    tenants = read_tenants(str(tenants_file))
    routers, pools, frontends = [], [], []
    for _ in range(2):
        pool = WorkerPool(fleet, ["p0", "p1"], ["d0", "d1"], PoolConfig(poll_s=0.02, poll_timeout_s=0.05))
        await pool.refresh()
        pool.start()
        frontend = Frontend(tokenizer, Limits(49152, 2 * HELD_TOKENS))
        flow = RequestFlow(pool, fleet, FlowConfig(kv_timeout_s=1.0, wait_for_worker_s=2.0))
        routers.append(Gateway(frontend, flow, lambda md: FakeTrace(), Drain(), tenants=tenants))
        pools.append(pool)
        frontends.append(frontend)
    try:
        yield fleet, routers
    finally:
        for pool, frontend in zip(pools, frontends):
            await pool.stop()
            frontend.close()


def _as(tenant: str):
    return (("authorization", f"Bearer tok-{tenant}"),)


async def _generate(gateway: Gateway, tenant: str, request_id: str, max_tokens: int = SHORT, n: int = 1):
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(1, 41))), request_id=request_id)
    request.sampling.max_tokens, request.sampling.temperature = max_tokens, 0.0
    if n > 1:
        request.n = n
    generation = await gateway.admit(_as(tenant), WireAsk(request), None)
    return [output async for output in gateway.stream(generation)]


def _tombstones(fleet: FakeFleet) -> int:
    return sum(len(w.tombstones) for w in fleet.workers.values())


def _on_decode_workers(fleet: FakeFleet) -> int:
    """Client requests the fake decode workers hold (each attempt's session knows its owner)."""
    return sum(s.owner is not None for w in fleet.workers.values() if w.role == "decode" for s in w.sessions.values())


def _run(tokenizer, tmp_path, body):
    path = tmp_path / "tenants"
    path.write_text(TENANTS)

    async def main():
        async with two_routers(tokenizer, path) as (fleet, routers):
            result = await body(fleet, *routers)
            return result, await settle(fleet), _tombstones(fleet)

    return asyncio.run(main())


async def _running(fleet: FakeFleet, stream: asyncio.Future, samples: int = 1) -> None:
    """Until every sample of the stream is on a decode worker (it decodes, or waits for its KV)."""
    await async_wait_until(lambda: stream.done() or _on_decode_workers(fleet) >= samples, 30, "the stream placed")


def test_an_abort_sent_to_the_other_router_ends_the_stream(tokenizer, tmp_path):
    async def body(fleet, a, b):
        stream = asyncio.ensure_future(_generate(a, "a", "long", HELD_TOKENS))
        await _running(fleet, stream)
        outcome = await b.abort(_as("a"), "long")
        return outcome, await stream

    (outcome, outputs), blocks, tombstones = _run(tokenizer, tmp_path, body)
    assert outcome == AbortOutcome.ABORTED
    assert outputs[-1].finish.reason == FinishReason.ABORT
    assert sum(len(o.token_ids) for o in outputs) < HELD_TOKENS
    assert not any(blocks.values()) and tombstones == 0


def test_an_abort_overtaking_its_generate_to_another_router_ends_it_and_the_id_serves_again(tokenizer, tmp_path):
    async def body(fleet, a, b):
        pending = await b.abort(_as("a"), "early")
        first = await _generate(a, "a", "early")
        left = _tombstones(fleet)
        again = await _generate(a, "a", "early")
        return pending, first, left, again

    (pending, first, left, again), blocks, tombstones = _run(tokenizer, tmp_path, body)
    assert pending == AbortOutcome.PENDING
    assert [o.token_ids for o in first] == [()] and first[-1].finish.reason == FinishReason.ABORT
    assert left == 0  # spent once: every worker forgot it before the stream ended
    assert again[-1].finish.reason == FinishReason.LENGTH and sum(len(o.token_ids) for o in again) == SHORT
    assert not any(blocks.values()) and tombstones == 0


def test_another_tenants_abort_through_the_other_router_leaves_the_request_alone(tokenizer, tmp_path):
    async def body(fleet, a, b):
        stream = asyncio.ensure_future(_generate(a, "a", "mine", 200))
        await _running(fleet, stream)
        foreign = await b.abort(_as("b"), "mine")  # b's tombstones, never a's request
        outputs = await stream
        own = await b.abort(_as("a"), "mine")  # ended at A: B knows nothing, the workers hold nothing
        return foreign, outputs, own

    (foreign, outputs, own), blocks, tombstones = _run(tokenizer, tmp_path, body)
    assert foreign == AbortOutcome.PENDING
    assert outputs[-1].finish.reason == FinishReason.LENGTH and sum(len(o.token_ids) for o in outputs) == 200
    assert own == AbortOutcome.PENDING
    assert not any(blocks.values())
    assert tombstones == 2 * 4  # b's and a's "mine" on each of the 4 workers, until they expire


def test_every_sample_of_a_request_ends_when_its_abort_reaches_another_router(tokenizer, tmp_path):
    async def body(fleet, a, b):
        stream = asyncio.ensure_future(_generate(a, "a", "two", HELD_TOKENS, n=2))
        await _running(fleet, stream, samples=2)
        outcome = await b.abort(_as("a"), "two")
        return outcome, await stream

    (outcome, outputs), blocks, tombstones = _run(tokenizer, tmp_path, body)
    assert outcome == AbortOutcome.ABORTED
    assert {o.index for o in outputs if o.finish is not None and o.finish.reason == FinishReason.ABORT} == {0, 1}
    assert not any(blocks.values()) and tombstones == 0


def test_an_abort_is_not_held_up_by_a_dead_worker(tokenizer, tmp_path):
    async def body(fleet, a, b):
        fleet.workers["d1"].kill()
        await async_wait_until(lambda: all("d1" not in [w.address for w in r.flow.pool.of_role("decode")]
                                           for r in (a, b)), 30, "d1 out of rotation")
        stream = asyncio.ensure_future(_generate(a, "a", "long", HELD_TOKENS))
        await _running(fleet, stream)
        return await b.abort(_as("a"), "long"), await stream

    (outcome, outputs), blocks, tombstones = _run(tokenizer, tmp_path, body)
    assert outcome == AbortOutcome.ABORTED and outputs[-1].finish.reason == FinishReason.ABORT
    assert not any(blocks.values()) and tombstones == 0


def test_an_abort_waits_for_workers_slow_to_answer_not_dead(tokenizer, tmp_path):
    """Workers that answer in 2 s (loaded: their Stats still answer) are waited for: the request
    is found and aborted, not answered PENDING with tombstones left behind."""
    async def body(fleet, a, b):
        stream = asyncio.ensure_future(_generate(a, "a", "long", HELD_TOKENS))
        await _running(fleet, stream)
        for worker in fleet.workers.values():
            worker.abort_answer_s = 2.0
        return await b.abort(_as("a"), "long"), await stream

    (outcome, outputs), blocks, tombstones = _run(tokenizer, tmp_path, body)
    assert outcome == AbortOutcome.ABORTED and outputs[-1].finish.reason == FinishReason.ABORT
    assert not any(blocks.values()) and tombstones == 0
