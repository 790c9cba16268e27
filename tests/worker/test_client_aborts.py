"""A worker's Abort by owner (pdserve/worker/client_aborts.py), through its servicers' common RPC:
the owner's requests it holds end ABORTED and give their blocks back, another tenant's id is
never touched, an owner aborted before its request came is refused once, and FORGET drops that."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from opentelemetry import trace

from decode_service.worker import DecodeJob
from pdserve.aborts import AbortScope, Owner
from pdserve.errors import ClientAborted
from pdserve.requests import Priority, SamplingParams
from pdserve.rpc.drain import Drain
from pdserve.rpc.owners import owner_to_pb, scope_to_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.worker.events import Tokens
from pdserve.worker.rpcs import CommonWorkerRpcs
from tests.worker.pair import make_pair, settle

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 25))
HELD = SamplingParams(temperature=0.0, max_tokens=480, ignore_eos=True)  # still decoding when the test acts
BLOCKS = -(-(len(PROMPT) + HELD.max_tokens) // 4)  # the pool holds it whole (blocks of 4: tests/worker/pair.py)


def _job(request_id: str, owner: Owner | None) -> DecodeJob:
    return DecodeJob(request_id, PROMPT, HELD, Priority.NORMAL, 10.0, True, owner=owner)


def _abort(owner: Owner, scope: AbortScope) -> wpb.WorkerAbortRequest:
    return wpb.WorkerAbortRequest(owner=owner_to_pb(owner), scope=scope_to_pb(scope))


def test_an_abort_by_owner_ends_its_request_only_for_its_tenant(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama, decode_blocks=BLOCKS)
        rpcs = CommonWorkerRpcs(pair.decode, trace.get_tracer("test"), Drain(), "inprocess")
        try:
            events = (await pair.decode.open(_job("x@0.ab", Owner("a", "x")))).events()
            assert isinstance(await asyncio.wait_for(anext(events), 30), Tokens)
            foreign = await rpcs.Abort(_abort(Owner("b", "x"), AbortScope.LIVE), None)
            own = await rpcs.Abort(_abort(Owner("a", "x"), AbortScope.LIVE), None)
            with pytest.raises(ClientAborted):
                async for _ in events:
                    pass
            return foreign.found, own.found, len(rpcs.aborts.tombstones), await settle(pair.decode_engine)
        finally:
            await pair.stop()

    assert asyncio.run(main()) == (False, True, 0, 0)


def test_an_owner_aborted_before_its_request_is_refused_once_and_forget_drops_it():
    nothing_held = SimpleNamespace(live=SimpleNamespace(records=list))
    rpcs = CommonWorkerRpcs(nothing_held, trace.get_tracer("test"), Drain(), "inprocess")
    early, late, other = Owner("a", "early"), Owner("a", "late"), Owner("b", "early")

    def arriving(owner: Owner) -> wpb.WorkerRequest:
        return wpb.WorkerRequest(request_id=f"{owner.request_id}@0.cd", owner=owner_to_pb(owner))

    async def main():
        remembered = await rpcs.Abort(_abort(early, AbortScope.REMEMBER), None)
        await rpcs.Abort(_abort(late, AbortScope.REMEMBER), None)
        await rpcs.Abort(_abort(late, AbortScope.FORGET), None)
        with pytest.raises(ClientAborted):
            rpcs.refuse_if_aborted(arriving(early))
        served = [rpcs.refuse_if_aborted(arriving(o)) for o in (early, other, late)]  # spent, another tenant's, forgotten
        return remembered.found, served, len(rpcs.aborts.tombstones)

    assert asyncio.run(main()) == (False, [early, other, late], 0)
