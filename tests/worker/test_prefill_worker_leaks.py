"""Every way a prefill request can end gives its blocks back and stops its work in the engine;
failures towards the decode worker are the decode worker's (PeerFault)."""

import asyncio

import pytest

from pdserve.requests import Priority
from pdserve.transfer import KVSender, TransferError, TransferResult
from pdserve.worker.events import Chunk, FirstToken
from pdserve.errors import PeerFault
from pdserve.worker.leases import LeaseKind, Leases, Reclaim
from pdserve.worker.kv_out import DecodePeer, Piece, Target
from prefill_service.worker import PrefillWorker
from tests.worker.pair import BLOCK, GREEDY, block_until, settle, start_engine

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 45))  # 40 tokens: 5 chunks of 8, 5 pieces
LONG = tuple(5 + i % 300 for i in range(400))  # 50 chunks


class Peer(DecodePeer):
    """Takes every piece, or refuses / never answers the first one."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.pushed = asyncio.Event()

    async def push_kv(self, endpoint: str, piece: Piece) -> None:
        self.pushed.set()
        if self.mode == "refuse":
            raise PeerFault("PushKV: no transfer 't' was set up here")
        if self.mode == "stuck":
            await asyncio.Event().wait()

    async def complete_kv(self, endpoint: str, transfer_id: str, num_pieces: int, first_token: int,
                          secret: bytes, checksums=()) -> None:
        return None


class Sender(KVSender):
    """Fails every send with `error`, or reports every one delivered."""

    def __init__(self, error: Exception | None = None):
        self.error = error

    async def send(self, peer_address, transfer_id, seq, pairs, timeout_s, *, secret):
        if self.error is not None:
            raise self.error
        return TransferResult(transfer_id, seq, 0, (), 0.0)

    async def close(self) -> None:
        return None


def _worker(engine, peer=None, sender=None) -> PrefillWorker:
    return PrefillWorker(engine, sender or Sender(TransferError("unused")), peer or Peer(), BLOCK,
                         engine.engine.kv.block_nbytes, Leases())


async def _open(worker, rid, prompt, kv_timeout_s=10.0, transfer_id="t"):
    blocks = tuple(range(-(-len(prompt) // BLOCK)))
    target = Target(transfer_id, b"", blocks, BLOCK, worker.block_nbytes, "decode:0", b"s" * 16, len(blocks))
    return await worker.open(rid, prompt, GREEDY, Priority.NORMAL, target, kv_timeout_s)


def test_a_piece_task_cancelled_before_it_first_ran_releases_its_hold(tiny_llama):
    """The stream closes in the same loop iteration that created a step's piece tasks, before
    any of them ran: their bodies never run, their holds come back all the same."""

    class ClosingAtFirstChunk(PrefillWorker):
        def on_step(self, result):
            super().on_step(result)
            job = self.live.get("r")
            if job is not None and job.tasks:
                self.live.close(job.session)

    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        worker = ClosingAtFirstChunk(engine, Sender(TransferError("unused")), Peer("stuck"), BLOCK,
                                     engine.engine.kv.block_nbytes, Leases())
        try:
            await _open(worker, "r", PROMPT)
            for _ in range(500):
                if not worker.live:
                    break
                await asyncio.sleep(0.01)
            left = await settle(engine)
            return left, len(worker.live), worker.peer.pushed.is_set(), worker.leases.live(LeaseKind.HOLD)
        finally:
            engine.stop()

    assert asyncio.run(main()) == (0, 0, False, 0)


def test_a_failed_piece_aborts_the_request_in_the_engine(tiny_llama):
    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        worker = _worker(engine, Peer("refuse"))
        try:
            session = await _open(worker, "r", LONG)
            with pytest.raises(PeerFault):
                async for _ in session.events():
                    pass
            worker.live.close(session)
            still_there = await engine.call(lambda e: e.scheduler.get("r") is not None)
            return still_there, await settle(engine)
        finally:
            engine.stop()

    assert asyncio.run(main()) == (False, 0)


def test_a_failed_kv_send_is_the_decode_workers_fault(tiny_llama):
    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        worker = _worker(engine, Peer(), Sender(TransferError("endpoint closed by peer")))
        try:
            session = await _open(worker, "r", PROMPT)
            with pytest.raises(PeerFault, match="endpoint closed by peer"):
                async for _ in session.events():
                    pass
            worker.live.close(session)
            return await settle(engine)
        finally:
            engine.stop()

    assert asyncio.run(main()) == 0


def test_a_hold_whose_send_outlives_the_kv_timeout_is_reclaimed(tiny_llama):
    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        worker = _worker(engine, Peer("stuck"))
        try:
            session = await _open(worker, "r", PROMPT, kv_timeout_s=0.3)
            with pytest.raises(PeerFault, match="not delivered"):
                async for _ in session.events():
                    pass
            worker.live.close(session)
            return await settle(engine), worker.leases.ends[LeaseKind.HOLD, Reclaim.EXPIRED]
        finally:
            engine.stop()

    left, expired = asyncio.run(main())
    assert left == 0 and expired == 1


def test_an_open_cancelled_after_the_engine_added_the_request_aborts_it(tiny_llama):
    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        worker = _worker(engine, Peer("stuck"))
        try:
            task = asyncio.ensure_future(_open(worker, "cut", LONG))
            await asyncio.sleep(0)
            # NOTE: blocks the loop: the engine adds and prefills (it is live there, or finished with
            # its blocks held), the reply waits here
            block_until(engine, lambda e: e.scheduler.get("cut") is not None or bool(e.scheduler.kv.holds()))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gone = await engine.call(lambda e: e.scheduler.get("cut") is None)
            return gone, await settle(engine), len(worker.live)
        finally:
            engine.stop()

    assert asyncio.run(main()) == (True, 0, 0)


def test_abort_stops_the_request_at_once(tiny_llama):
    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        worker = _worker(engine, Peer("stuck"))
        try:
            session = await _open(worker, "r", LONG)
            await asyncio.wait_for(worker.peer.pushed.wait(), 10)
            found = worker.live.abort("r")
            gone = await engine.call(lambda e: e.scheduler.get("r") is None)
            with pytest.raises(asyncio.CancelledError):
                async for _ in session.events():
                    pass
            return found, gone, await settle(engine)
        finally:
            engine.stop()

    assert asyncio.run(main()) == (True, True, 0)


def test_steps_of_an_earlier_request_never_reach_a_later_one_with_its_id(tiny_llama):
    """Step results reach the loop late; meanwhile the first request closed and a second one
    opened under the same id. Only the second one's own chunks become its pieces."""

    class Recording(Peer):
        def __init__(self):
            super().__init__()
            self.pieces: list[Piece] = []

        async def push_kv(self, endpoint: str, piece: Piece) -> None:
            self.pieces.append(piece)

    async def main():
        engine = start_engine(tiny_llama, hold_blocks=True, num_blocks=128)
        add = engine.add_listener
        engine.add_listener = lambda listener: add(
            lambda result: asyncio.get_running_loop().call_later(0.3, listener, result))
        peer = Recording()
        worker = _worker(engine, peer, Sender())
        try:
            first = await _open(worker, "same", LONG, transfer_id="t-first")
            # the engine prefills (some chunks, or all: then it is gone); the loop hears of it later
            block_until(engine, lambda e: (r := e.scheduler.get("same")) is None or r.num_computed_tokens > 0)
            worker.live.close(first)
            second = await _open(worker, "same", tuple(range(350, 358)), transfer_id="t-second")
            events = [e async for e in second.events()]
            worker.live.close(second)
            return events, peer.pieces, await settle(engine)
        finally:
            engine.stop()

    events, pieces, left = asyncio.run(main())
    assert [(e.start, e.num_tokens) for e in events if isinstance(e, Chunk)] == [(0, 8)]
    assert isinstance(events[-1], FirstToken) and events[-1].kv_blocks == 2
    assert [(p.transfer_id, p.seq, len(p.src_block_ids)) for p in pieces if p.transfer_id == "t-second"] == \
        [("t-second", 0, 2)]
    assert left == 0
