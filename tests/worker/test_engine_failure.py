"""The engine under a worker dies: every open stream ends with EngineFailed. One request's
fault in a step ends that request's stream only."""

import asyncio

import pytest

from decode_service.worker import DecodeJob, DecodeWorker
from pdserve.errors import EngineFailed, RequestFailed
from pdserve.engine.faults import FaultInjector, InjectedFault, RequestFault
from pdserve.requests import FinishReason, Priority, SamplingParams
from pdserve.worker.events import Finished
from pdserve.worker.leases import Leases
from tests.worker.pair import make_pair, start_engine

pytestmark = pytest.mark.timeout(120)

LONG = tuple(5 + i % 300 for i in range(200))
SAMPLING = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


class Switch(FaultInjector):
    """Raises the armed fault before a step: the next one, or the one `after` steps from now."""

    def __init__(self) -> None:
        self.fault: Exception | None = None
        self.after = 0

    def arm(self, fault: Exception, after: int = 0) -> None:
        self.fault, self.after = fault, after

    def check(self) -> None:
        if self.fault is None:
            return
        if self.after > 0:
            self.after -= 1
            return
        fault, self.fault = self.fault, None
        raise fault


async def _drain(session):
    return [event async for event in session.events()]


def test_every_open_decode_stream_fails_when_the_engine_dies(tiny_llama):
    async def main():
        switch = Switch()
        engine = start_engine(tiny_llama, hold_blocks=False, num_blocks=160, faults=switch)
        decode = DecodeWorker(engine, None, Leases())
        try:
            switch.arm(InjectedFault("a broken step"), after=6)  # both mid-prefill: 25 steps each
            sessions = [await decode.open(DecodeJob(f"r{i}", LONG, SAMPLING, Priority.NORMAL, 10.0, True))
                        for i in range(2)]
            streams = [asyncio.ensure_future(_drain(s)) for s in sessions]
            done, _ = await asyncio.wait(streams, timeout=5)
            return [type(t.exception()) for t in done], str(streams[0].exception())
        finally:
            engine.stop()

    kinds, message = asyncio.run(main())
    assert kinds == [EngineFailed, EngineFailed]
    assert "the engine of this worker failed" in message and "a broken step" in message


def test_a_prefill_stream_fails_when_the_engine_dies(tiny_llama):
    async def main():
        switch = Switch()
        pair = await make_pair(tiny_llama, decode_blocks=128, prefill_faults=switch)
        try:
            d_session = await pair.decode.open(pair.job("r", LONG))
            reserved = await asyncio.wait_for(anext(d_session.events()), 10)
            switch.arm(InjectedFault("a broken step"), after=3)
            p_session = await pair.prefill.open("r", LONG, SAMPLING, Priority.NORMAL, pair.target(reserved), 10.0)
            with pytest.raises(EngineFailed):
                await asyncio.wait_for(_drain(p_session), 5)
            pair.prefill.live.close(p_session)
            pair.decode.live.close(d_session)
        finally:
            await pair.stop()

    asyncio.run(main())


def test_a_request_at_fault_fails_alone(tiny_llama):
    async def main():
        switch = Switch()
        engine = start_engine(tiny_llama, hold_blocks=False, num_blocks=160, faults=switch)
        decode = DecodeWorker(engine, None, Leases())
        try:
            bad, good = [await decode.open(DecodeJob(rid, LONG[:40], SAMPLING, Priority.NORMAL, 10.0, True))
                         for rid in ("bad", "good")]
            switch.arm(RequestFault("bad", InjectedFault("poison")))
            with pytest.raises(RequestFailed):
                await asyncio.wait_for(_drain(bad), 10)
            decode.live.close(bad)
            events = await asyncio.wait_for(_drain(good), 30)
            decode.live.close(good)
            return events[-1]
        finally:
            engine.stop()

    last = asyncio.run(main())
    assert isinstance(last, Finished) and last.reason == FinishReason.LENGTH
