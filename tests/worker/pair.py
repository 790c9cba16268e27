"""A prefill and a decode worker in one process: real engines on the tiny model, the in-process
KV transport, and a decode peer that calls the decode worker directly (as the gRPC one would,
turning its refusals into PeerFault). `Pair.serve` plays the router's part for one request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from decode_service.worker import DecodeJob, DecodeWorker
from pdserve.config import CacheConfig, EngineConfig, SchedulerConfig
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.engine.faults import FaultInjector, NoFaults
from pdserve.requests import Priority, SamplingParams
from pdserve.transfer import InProcessFabric, KVReceiver, KVSender, make_transport
from pdserve.errors import ChecksumMismatch, CorruptKV, PeerFault
from pdserve.worker.events import Finished, FirstToken, Reserved, Tokens
from pdserve.worker.leases import LeaseKind, Leases
from pdserve.worker.kv_out import DecodePeer, Piece, Target
from prefill_service.worker import PrefillWorker

BLOCK = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


class LocalPeer(DecodePeer):
    def __init__(self, decode: DecodeWorker):
        self.decode = decode

    async def push_kv(self, endpoint: str, piece: Piece) -> None:
        try:
            assert self.decode.presented(piece.transfer_id, piece.secret)
            self.decode.push_kv(piece.transfer_id, piece.seq, piece.block_index, piece.src_block_ids, piece.timeout_s)
        except Exception as exc:
            raise PeerFault(f"PushKV: {exc}") from exc

    async def complete_kv(self, endpoint: str, transfer_id: str, num_pieces: int, first_token: int,
                          secret: bytes, checksums=()) -> None:
        try:
            assert self.decode.presented(transfer_id, secret)
            await self.decode.complete_kv(transfer_id, num_pieces, first_token, checksums)
        except ChecksumMismatch as exc:  # as the gRPC peer: what the sender sent landed corrupt
            raise CorruptKV(f"CompleteKV: {exc}") from exc
        except Exception as exc:
            raise PeerFault(f"CompleteKV: {exc}") from exc


def start_engine(loaded, hold_blocks: bool, num_blocks: int = 64, token_budget: int = 8,
                 faults: FaultInjector = NoFaults()) -> AsyncEngine:
    """Chunks of 8 tokens: a 40-token prompt is prefilled in 5 steps, 5 pieces of 2 blocks."""
    cache = CacheConfig(block_size=BLOCK, num_blocks=num_blocks, num_host_blocks=0)
    scheduler = SchedulerConfig(policy="chunked", token_budget=token_budget, max_chunk_tokens=token_budget,
                                aging_seconds=None)
    engine = Engine(EngineConfig(attention_backend="torch", cache=cache, scheduler=scheduler), loaded=loaded,
                    hold_blocks=hold_blocks)
    async_engine = AsyncEngine(engine, faults=faults)
    async_engine.start(asyncio.get_running_loop())
    return async_engine


def active(engine: AsyncEngine) -> int:
    return engine.engine.scheduler.stats().kv.active


def block_until(engine: AsyncEngine, check: Callable[[Engine], bool], timeout_s: float = 30.0) -> None:
    """Blocks this thread, the event loop's, until `check(engine)` holds under the engine's lock:
    whatever the engine thread did meanwhile (add, reserve, prefill) the loop hears of afterwards."""
    deadline = time.monotonic() + timeout_s
    while True:
        with engine.engine.lock:
            if check(engine.engine):
                return
        assert time.monotonic() < deadline, "the engine never reached the state waited for"
        time.sleep(0.005)


async def settle(engine: AsyncEngine, timeout_s: float = 10.0) -> int:
    """Active blocks once they reach zero, or what is left after timeout_s."""
    for _ in range(int(timeout_s / 0.02)):
        left = await engine.call(lambda e: e.scheduler.stats().kv.active)
        if left == 0:
            return 0
        await asyncio.sleep(0.02)
    return await engine.call(lambda e: e.scheduler.stats().kv.active)


@dataclass
class Outcome:
    first_token: int | None
    tokens: list[int]
    finished: Finished | None


async def decoded(first_token: int, events) -> Outcome:
    """The decode stream's `events` after the first token, to its end."""
    outcome = Outcome(first_token, [], None)
    async for event in events:
        if isinstance(event, Tokens):
            outcome.tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            outcome.finished = event
    return outcome


@dataclass
class Pair:
    prefill: PrefillWorker
    decode: DecodeWorker
    prefill_engine: AsyncEngine
    decode_engine: AsyncEngine
    sender: KVSender
    receiver: KVReceiver

    def target(self, reserved: Reserved) -> Target:
        return Target(reserved.transfer_id, self.receiver.address(), reserved.block_ids, BLOCK,
                      self.decode_engine.engine.kv.block_nbytes, "decode:0", reserved.secret,
                      self.decode_engine.engine.kv.num_blocks, reserved.cached_blocks)

    def job(self, request_id: str, prompt: tuple[int, ...], sampling: SamplingParams = GREEDY,
            kv_timeout_s: float = 10.0, resumed: tuple[int, ...] = ()) -> DecodeJob:
        return DecodeJob(request_id, prompt, sampling, Priority.NORMAL, kv_timeout_s, False, resumed)

    async def serve(self, request_id: str, prompt: tuple[int, ...], sampling: SamplingParams = GREEDY,
                    resumed: tuple[int, ...] = ()) -> Outcome:
        """Decode reserves, prefill fills the reservation, decode streams to the end; `resumed`:
        the tokens a request had out before (a resume through the prefill worker)."""
        d_session = await self.decode.open(self.job(request_id, prompt, sampling, resumed=resumed))
        events = d_session.events()
        try:
            reserved = await anext(events)
            assert isinstance(reserved, Reserved)
            p_session = await self.prefill.open(request_id, prompt, sampling, Priority.NORMAL, self.target(reserved),
                                                10.0, resumed)
            try:
                done = [e async for e in p_session.events() if isinstance(e, FirstToken)]
            finally:
                self.prefill.live.close(p_session)
            return await decoded(done[0].token_id, events)
        finally:
            self.decode.live.close(d_session)

    async def holds_nothing(self) -> bool:
        """Both engines back to no active block, and the prefill worker holding no lease."""
        return (await settle(self.prefill_engine) == 0 and await settle(self.decode_engine) == 0
                and self.prefill.leases.live(LeaseKind.WAITING) == 0 and self.prefill.leases.live(LeaseKind.HOLD) == 0)

    async def stop(self) -> None:
        await self.sender.close()
        await self.receiver.close()
        self.prefill_engine.stop()
        self.decode_engine.stop()


async def make_pair(loaded, decode_blocks: int = 64, prefill_faults: FaultInjector = NoFaults(),
                    decode_faults: FaultInjector = NoFaults(), quarantine_timeout_s: float = 60.0) -> Pair:
    fabric = InProcessFabric()
    transport = make_transport("inprocess", fabric=fabric)
    p_engine = start_engine(loaded, hold_blocks=True, faults=prefill_faults)
    d_engine = start_engine(loaded, hold_blocks=False, num_blocks=decode_blocks, faults=decode_faults)
    receiver = transport.receiver(d_engine.engine.kv.data)
    sender = transport.sender(p_engine.engine.kv.data)
    decode = DecodeWorker(d_engine, receiver, Leases(), quarantine_timeout_s)
    prefill = PrefillWorker(p_engine, sender, LocalPeer(decode), BLOCK, p_engine.engine.kv.block_nbytes, Leases())
    return Pair(prefill, decode, p_engine, d_engine, sender, receiver)
