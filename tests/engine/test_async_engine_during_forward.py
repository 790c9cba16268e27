"""What must not wait for a forward pass: a read-only query (the router's prefix probe) is
answered while the model runs, and blocks reserved for a remote request are announced before
the step's forward pass, so the prefill worker can start while the decode worker computes. The
stats a Stats poll reads meanwhile are the step's scheduling decision's: a request just added
counts as waiting only once a decision left it queued (the router rebalances on that count)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import pytest

from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.outputs import StepResult
from pdserve.requests import SamplingParams
from tests.engine.driver import make_engine
from tests.helpers.waiting import async_wait_until

pytestmark = pytest.mark.timeout(120)

BLOCK = 4


class Gate:
    """Holds each forward pass inside execute() until a permit is given (`let`)."""

    def __init__(self, engine) -> None:
        self.entered = 0
        self._inside = threading.Condition()
        self._permits = threading.Semaphore(0)
        execute = engine.runner.execute

        def gated(output):
            if output.chunks:
                with self._inside:
                    self.entered += 1
                    self._inside.notify_all()
                assert self._permits.acquire(timeout=30), "no permit given"
            return execute(output)

        engine.runner.execute = gated

    def let(self, steps: int = 1) -> None:
        for _ in range(steps):
            self._permits.release()

    async def inside(self, count: int) -> None:
        """Until the count-th forward pass has started (and waits for its permit)."""
        def wait() -> bool:
            with self._inside:
                return self._inside.wait_for(lambda: self.entered >= count, 30)
        assert await asyncio.to_thread(wait)


def test_a_prefix_probe_is_answered_while_the_forward_pass_runs(tiny_loaded):
    async def main() -> None:
        engine = make_engine(tiny_loaded["llama_gqa_llama3"], block_size=BLOCK)
        prompt = list(range(5, 29))
        engine.add_request("done", prompt, SamplingParams(max_tokens=1))
        while engine.has_unfinished():
            engine.step()
        gate = Gate(engine)
        async_engine = AsyncEngine(engine)
        async_engine.start(asyncio.get_running_loop())
        try:
            await async_engine.call(lambda e: e.add_request("busy", list(range(40, 60)), SamplingParams(max_tokens=4)))
            await gate.inside(1)
            probed = await asyncio.wait_for(async_engine.query(lambda e: e.scheduler.kv.probe(prompt)), 10)
            assert probed == len(prompt) // BLOCK * BLOCK  # the finished request's blocks, cached
            waiting = asyncio.ensure_future(async_engine.call(lambda e: e.scheduler.kv.probe(prompt)))
            await asyncio.sleep(0.2)
            assert not waiting.done()  # a command waits for the step to end
            gate.let(100)
            assert await asyncio.wait_for(waiting, 30) == probed
        finally:
            gate.let(100)
            async_engine.stop()

    asyncio.run(main())


def test_a_remote_requests_reservation_is_announced_before_the_forward_pass(tiny_loaded):
    async def main() -> None:
        engine = make_engine(tiny_loaded["llama_gqa_llama3"], block_size=BLOCK)
        gate = Gate(engine)
        async_engine = AsyncEngine(engine)
        results: list[StepResult] = []
        async_engine.add_listener(results.append)
        async_engine.start(asyncio.get_running_loop())
        try:
            await async_engine.call(lambda e: e.add_request("busy", list(range(40, 60)), SamplingParams(max_tokens=4)))
            await gate.inside(1)
            remote = asyncio.ensure_future(async_engine.call(
                lambda e: e.add_remote_request("remote", list(range(5, 25)), SamplingParams(max_tokens=4))))
            await asyncio.sleep(0)  # the command is queued before the first step may end
            gate.let()  # the first step ends; the remote request is added; the next step reserves
            await asyncio.wait_for(remote, 30)
            await gate.inside(2)  # ... and is now held in its forward pass
            await async_wait_until(lambda: any(r.reserved for r in results), 30, "the reservation announced")
            assert [x.request.request_id for r in results for x in r.reserved] == ["remote"]
            assert sum(bool(r.outputs) for r in results) == 1  # only the first step's: the second is still running
        finally:
            gate.let(100)
            async_engine.stop()

    asyncio.run(main())


def test_a_request_the_step_admitted_counts_as_running_during_its_forward_pass(tiny_loaded):
    """Not as waiting: the stats taken between the command that added it and the step's decision
    said `waiting` for the whole step, and a router polling then saw an under-full decode worker
    as under memory pressure and moved a stream off it (the colocated Gemma 3 e2e test, under load)."""
    async def main() -> None:
        async with _gated(make_engine(tiny_loaded["llama_gqa_llama3"], block_size=BLOCK)) as (async_engine, gate):
            await async_engine.call(lambda e: e.add_request("new", list(range(40, 60)), SamplingParams(max_tokens=4)))
            await gate.inside(1)  # its first step: admitted, held in the forward pass
            stats = async_engine.stats
            assert (stats.running, stats.waiting) == (1, 0)

    asyncio.run(main())


def test_a_request_the_step_left_queued_counts_as_waiting_during_its_forward_pass(tiny_loaded):
    """No free place (--max-num-seqs 1): the decision leaves the second request queued, and the
    stats say so while the step runs."""
    async def main() -> None:
        engine = make_engine(tiny_loaded["llama_gqa_llama3"], block_size=BLOCK, max_running=1)
        async with _gated(engine) as (async_engine, gate):
            await async_engine.call(lambda e: e.add_request("first", list(range(40, 60)), SamplingParams(max_tokens=8)))
            await gate.inside(1)
            second = asyncio.ensure_future(async_engine.call(
                lambda e: e.add_request("second", list(range(5, 25)), SamplingParams(max_tokens=4))))
            await asyncio.sleep(0)  # the command is queued before the first step may end
            gate.let()  # the first step ends; the second request is added; the next step leaves it queued
            await asyncio.wait_for(second, 30)
            await gate.inside(2)
            stats = async_engine.stats
            assert (stats.running, stats.waiting) == (1, 1)

    asyncio.run(main())


@contextlib.asynccontextmanager
async def _gated(engine) -> AsyncIterator[tuple[AsyncEngine, Gate]]:
    """`engine` run by an AsyncEngine, its forward passes held by a Gate (all let go at the end)."""
    gate = Gate(engine)
    async_engine = AsyncEngine(engine)
    async_engine.start(asyncio.get_running_loop())
    try:
        yield async_engine, gate
    finally:
        gate.let(100)
        async_engine.stop()
