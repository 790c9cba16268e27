"""After a withdrawal that leaves blocks unsafe, only those blocks stay out of use, as a lease:
back once the transport says nothing can touch them, or once the quarantine's limit passed."""

import asyncio
import time

import pytest

from decode_service.worker import DecodeJob, DecodeWorker
from pdserve.requests import Priority
from pdserve.rpc.stats import stats_to_pb
from pdserve.transfer import CancelResult, InProcessFabric, KVReceiver, make_transport
from pdserve.worker.events import Reserved
from pdserve.worker.leases import LeaseKind, Leases, Reclaim
from tests.worker.pair import GREEDY, settle, start_engine

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 45))  # 40 tokens: 10 blocks of 4


class StuckReceives(KVReceiver):
    """An in-process receiver whose withdrawals leave the first two blocks of each piece unsafe,
    as a UCX receive already being written does; `settled` is the test's to resolve."""

    def __init__(self, inner: KVReceiver, observable: bool):
        self.inner = inner
        self.observable = observable
        self.settled: asyncio.Future | None = None
        self.posted: dict[str, tuple[int, ...]] = {}

    def address(self) -> bytes:
        return self.inner.address()

    async def expect(self, transfer_id, seq, pairs, timeout_s, *, secret):
        self.posted.setdefault(transfer_id, tuple(dst for _, dst in pairs[:2]))
        return await self.inner.expect(transfer_id, seq, pairs, timeout_s, secret=secret)

    def cancel(self, transfer_id: str) -> CancelResult:
        result = self.inner.cancel(transfer_id)
        self.settled = asyncio.get_running_loop().create_future() if self.observable else None
        return CancelResult(transfer_id, result.pieces, self.posted.get(transfer_id, ()), self.settled)

    async def close(self) -> None:
        await self.inner.close()


async def _quarantined_request(observable: bool, quarantine_timeout_s: float, loaded):
    engine = start_engine(loaded, hold_blocks=False)
    receiver = StuckReceives(make_transport("inprocess", fabric=InProcessFabric()).receiver(engine.engine.kv.data),
                             observable)
    decode = DecodeWorker(engine, receiver, Leases(), quarantine_timeout_s)
    session = await decode.open(DecodeJob("q", PROMPT, GREEDY, Priority.NORMAL, 10.0, False))
    reserved = await asyncio.wait_for(anext(session.events()), 10)
    assert isinstance(reserved, Reserved)
    decode.push_kv(reserved.transfer_id, 0, 0, (0, 1), 30.0)
    await asyncio.sleep(0)
    decode.live.close(session)  # the stream is cut while the piece is in flight
    return engine, receiver, decode, reserved


async def _wait_quarantined(engine, decode) -> tuple[int, int]:
    """The blocks held while the quarantine lease is live. Polled at every turn of the loop: its
    expiry is a timer on the loop, so it cannot pass between the lease starting and this seeing it
    (a coarser poll could miss a short quarantine whole), nor between seeing it and the stats
    call queued at once behind it."""
    deadline = time.monotonic() + 30
    while not decode.leases.live(LeaseKind.QUARANTINE):
        assert time.monotonic() < deadline, "no quarantine lease"
        await asyncio.sleep(0)
    stats = await engine.call(lambda e: e.scheduler.stats())
    return stats.kv.active, stats.kv.quarantined


def test_only_the_unsafe_blocks_stay_out_until_the_transport_says_the_receive_is_over(tiny_llama):
    async def main():
        engine, receiver, decode, reserved = await _quarantined_request(True, 60.0, tiny_llama)
        try:
            during = await _wait_quarantined(engine, decode)
            wire = stats_to_pb("decode", await engine.call(lambda e: e.scheduler.stats()), False)
            receiver.settled.set_result(None)
            left = await settle(engine)
            return during, wire.blocks_quarantined, left, decode.leases.ends
        finally:
            await receiver.close()
            engine.stop()

    during, wire_quarantined, left, ends = asyncio.run(main())
    assert during == (2, 2)  # the other 8 reserved blocks came back at once
    assert wire_quarantined == 2
    assert left == 0 and ends[LeaseKind.QUARANTINE, Reclaim.SETTLED] == 1


def test_blocks_the_transport_cannot_vouch_for_come_back_after_the_quarantine_limit(tiny_llama):
    async def main():
        engine, receiver, decode, _ = await _quarantined_request(False, 0.3, tiny_llama)
        try:
            during = await _wait_quarantined(engine, decode)
            left = await settle(engine)
            return during, left, decode.leases.ends
        finally:
            await receiver.close()
            engine.stop()

    during, left, ends = asyncio.run(main())
    assert during == (2, 2)
    assert left == 0 and ends[LeaseKind.QUARANTINE, Reclaim.EXPIRED] == 1
