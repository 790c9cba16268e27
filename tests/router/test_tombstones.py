"""An Abort that overtakes its Generate still cancels it (router/doors/tombstones.py): the router keeps
the ids aborted while unknown, per tenant, bounded in time and size; and it tells an Abort of a
request that ended from one of a request not seen yet."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.requests import FinishReason
from pdserve.rpc.drain import Drain
from pdserve.tokenizer import load_tokenizer
from pdserve.v1 import generation_pb2 as pb
from pdserve.validation import Limits
from router.doors.frontend import Frontend
from router.doors.gateway import Gateway
from router.doors.servicer import WireAsk
from router.doors.tenants import read_tenants
from router.doors.tombstones import AbortOutcome, RecentIds, TombstoneConfig
from tests.router.flow_harness import harness
from tests.router.fake_trace import FakeTrace

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_id_is_remembered_for_its_time_and_per_tenant():
    clock = Clock()
    ids = RecentIds(TombstoneConfig(ttl_s=10.0, max_per_tenant=8), clock)
    ids.add("acme", "r1")
    assert ids.has("acme", "r1") and not ids.has("other", "r1")
    clock.now = 9.9
    assert ids.take("acme", "r1") and not ids.take("acme", "r1")  # taken once
    ids.add("acme", "r2")
    clock.now = 20.0
    assert not ids.has("acme", "r2") and len(ids) == 0  # expired


def test_the_oldest_ids_of_a_tenant_are_forgotten_beyond_its_bound():
    clock = Clock()
    ids = RecentIds(TombstoneConfig(ttl_s=10.0, max_per_tenant=3), clock)
    for i in range(5):
        clock.now = i * 0.1
        ids.add("acme", f"r{i}")
    ids.add("other", "r0")
    assert [ids.has("acme", f"r{i}") for i in range(5)] == [False, False, True, True, True]
    assert ids.has("other", "r0") and len(ids) == 4


TENANTS = "tok-a tenant=a\ntok-b tenant=b\n"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def _run(tokenizer, tmp_path, body):
    path = tmp_path / "tenants"
    path.write_text(TENANTS)

    async def main():
        async with harness() as h:
            frontend = Frontend(tokenizer, Limits(49152, 8192))
            gateway = Gateway(frontend, h.flow, lambda md: FakeTrace(), Drain(), tenants=read_tenants(str(path)))
            try:
                return await body(gateway, h)
            finally:
                frontend.close()

    return asyncio.run(main())


def _as(tenant: str):
    return (("authorization", f"Bearer tok-{tenant}"),)


async def _generate(gateway: Gateway, tenant: str, request_id: str):
    request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=list(range(1, 41))), request_id=request_id)
    request.sampling.max_tokens, request.sampling.temperature = 8, 0.0
    generation = await gateway.admit(_as(tenant), WireAsk(request), None)
    return [output async for output in gateway.stream(generation)]


def test_an_abort_before_its_generate_cancels_it_on_arrival_and_nothing_runs(tokenizer, tmp_path):
    async def body(gateway, h):
        assert await gateway.abort(_as("a"), "early") == AbortOutcome.PENDING
        outputs = await _generate(gateway, "a", "early")
        served = await _generate(gateway, "a", "early")  # the tombstone is spent: the id serves again
        return outputs, served, sum(len(w.sessions) for w in h.fleet.workers.values())

    outputs, served, sessions = _run(tokenizer, tmp_path, body)
    assert [o.token_ids for o in outputs] == [()] and outputs[-1].finish.reason == FinishReason.ABORT
    assert served[-1].finish.reason == FinishReason.LENGTH and sum(len(o.token_ids) for o in served) == 8
    assert sessions == 0


def test_an_abort_of_an_ended_request_says_so_and_leaves_no_tombstone(tokenizer, tmp_path):
    async def body(gateway, h):
        await _generate(gateway, "a", "done")
        ended = await gateway.abort(_as("a"), "done")
        again = await _generate(gateway, "a", "done")
        return ended, again, len(gateway.tombstones)

    ended, again, tombstones = _run(tokenizer, tmp_path, body)
    assert ended == AbortOutcome.ENDED
    assert again[-1].finish.reason == FinishReason.LENGTH and tombstones == 0


def test_a_tenant_cannot_abort_another_tenants_request(tokenizer, tmp_path):
    async def body(gateway, h):
        stream = asyncio.ensure_future(_generate(gateway, "a", "mine"))
        while "mine" not in gateway.active:
            await asyncio.sleep(0.001)
        foreign = await gateway.abort(_as("b"), "mine")  # b's tombstone, not a's request
        outputs = await stream
        own = await gateway.abort(_as("a"), "mine")
        return foreign, outputs, own

    foreign, outputs, own = _run(tokenizer, tmp_path, body)
    assert foreign == AbortOutcome.PENDING
    assert outputs[-1].finish.reason == FinishReason.LENGTH and own == AbortOutcome.ENDED


def test_an_abort_of_a_running_request_aborts_it(tokenizer, tmp_path):
    async def body(gateway, h):
        stream = asyncio.ensure_future(_generate(gateway, "a", "live"))
        while "live" not in gateway.active:
            await asyncio.sleep(0.001)
        outcome = await gateway.abort(_as("a"), "live")
        return outcome, await stream

    outcome, outputs = _run(tokenizer, tmp_path, body)
    assert outcome == AbortOutcome.ABORTED and outputs[-1].finish.reason == FinishReason.ABORT
