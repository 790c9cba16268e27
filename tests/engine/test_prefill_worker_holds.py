"""A prefill worker closed while a piece is stuck in flight gives back every block it held.

The pieces of one request go out in order, so the second piece's task waits for the first; a
close then cancels a task whose send never started. Its hold must be released all the same.
"""

import asyncio

import pytest

from pdserve.engine.async_engine import AsyncEngine
from pdserve.requests import Priority, SamplingParams
from pdserve.transfer import InProcessFabric, make_transport
from pdserve.worker.leases import Leases
from pdserve.worker.kv_out import DecodePeer, Piece, Target
from prefill_service.worker import PrefillWorker
from tests.engine.driver import make_engine

pytestmark = pytest.mark.timeout(120)

BLOCK = 4


class StuckPeer(DecodePeer):
    """Accepts nothing: the first piece's announcement never returns."""

    def __init__(self) -> None:
        self.pushed = asyncio.Event()

    async def push_kv(self, endpoint: str, piece: Piece) -> None:
        self.pushed.set()
        await asyncio.Event().wait()

    async def complete_kv(self, endpoint: str, transfer_id: str, num_pieces: int, first_token: int,
                          secret: bytes, checksums=()) -> None:
        raise AssertionError("no piece was delivered")


def _active(engine) -> int:
    return engine.scheduler.stats().kv.active


def test_closing_with_pieces_queued_behind_a_stuck_one_releases_every_hold(tiny_loaded):
    async def main() -> int:
        engine = make_engine(tiny_loaded["llama_gqa_llama3"], block_size=BLOCK, token_budget=8, max_chunk_tokens=8)
        engine.hold_blocks = True
        async_engine = AsyncEngine(engine)
        async_engine.start(asyncio.get_running_loop())
        peer = StuckPeer()
        sender = make_transport("inprocess", fabric=InProcessFabric()).sender(engine.kv.data)
        worker = PrefillWorker(async_engine, sender, peer, BLOCK, engine.kv.block_nbytes, Leases())
        prompt = tuple(range(5, 45))  # 40 tokens: 5 chunks of 8, so 5 pieces queue behind the first
        target = Target("t-1", b"", tuple(range(100, 110)), BLOCK, engine.kv.block_nbytes, "decode:0", b"s" * 16,
                        110)
        try:
            session = await worker.open("r-1", prompt, SamplingParams(max_tokens=4), Priority.NORMAL, target, 30.0)
            await asyncio.wait_for(peer.pushed.wait(), 30)
            for _ in range(200):  # let the prefill finish: every chunk's piece is now queued or stuck
                if len(worker.live["r-1"].tasks) >= 5:
                    break
                await asyncio.sleep(0.05)
            assert len(worker.live["r-1"].tasks) >= 5
            worker.live.close(session)
            for _ in range(100):
                if await async_engine.call(_active) == 0:
                    break
                await asyncio.sleep(0.05)
            return await async_engine.call(_active)
        finally:
            await sender.close()
            async_engine.stop()

    assert asyncio.run(main()) == 0
