"""AsyncEngine failure is loud: a fatal step fails every call at once and tells its listeners
once; a RequestFault aborts its request only and the others run on unchanged."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from pdserve.config import SchedulerConfig

from pdserve.engine.async_engine import AsyncEngine
from pdserve.errors import EngineFailed
from pdserve.engine.faults import FileTrigger, RequestFault
from pdserve.engine.outputs import AbortResult, StepResult
from tests.engine.driver import GREEDY, make_engine, tiny_prompt
from tests.helpers.waiting import async_wait_until

pytestmark = pytest.mark.timeout(120)


class BrokenEngine:
    """Has work once armed; its step waits for `go`, then raises `error`."""

    def __init__(self, error: BaseException):
        self.error = error
        self.scheduler = SimpleNamespace(stats=lambda: "stats", cfg=SchedulerConfig())
        self.armed = threading.Event()
        self.stepping = threading.Event()
        self.go = threading.Event()
        self.aborted: list[str] = []
        self.lock = threading.Lock()

    def has_unfinished(self) -> bool:
        return self.armed.is_set()

    def step(self, on_reserved=None, on_decided=None) -> StepResult:
        self.stepping.set()
        self.go.wait(10)
        raise self.error

    def abort(self, request_id: str) -> AbortResult:
        self.aborted.append(request_id)
        self.armed.clear()
        return AbortResult(True)


async def _started(engine) -> AsyncEngine:
    async_engine = AsyncEngine(engine, idle_wait_s=0.01)
    async_engine.start(asyncio.get_running_loop())
    return async_engine


async def _until(event: threading.Event) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, 10)


def test_a_fatal_step_fails_pending_and_later_calls_at_once_and_tells_listeners_once():
    async def main() -> None:
        engine = BrokenEngine(RuntimeError("bad batch"))
        async_engine = await _started(engine)
        heard: list[BaseException] = []
        async_engine.add_failure_listener(heard.append)
        engine.armed.set()
        await _until(engine.stepping)
        pending = asyncio.ensure_future(async_engine.call(lambda e: "never runs"))
        await asyncio.sleep(0.05)
        engine.go.set()
        with pytest.raises(EngineFailed, match="bad batch"):
            await asyncio.wait_for(pending, 2)
        with pytest.raises(EngineFailed):
            await asyncio.wait_for(async_engine.call(lambda e: "nor this"), 1)
        async_engine.call_nowait(lambda e: None)
        await async_wait_until(lambda: heard, 30, "the failure listener told")
        assert [str(e) for e in heard] == ["bad batch"]
        assert async_engine.failed
        late: list[BaseException] = []
        async_engine.add_failure_listener(late.append)
        await async_wait_until(lambda: late, 30, "a listener added after the failure told")
        assert late == heard
        async_engine.stop()

    asyncio.run(main())


def test_a_request_fault_aborts_that_request_and_the_engine_goes_on():
    async def main() -> None:
        engine = BrokenEngine(RequestFault("r-1", ValueError("nan logits")))
        engine.go.set()
        async_engine = await _started(engine)
        faults: list[RequestFault] = []
        failures: list[BaseException] = []
        async_engine.add_request_fault_listener(faults.append)
        async_engine.add_failure_listener(failures.append)
        engine.armed.set()
        await async_wait_until(lambda: faults, 30, "the request fault heard")
        assert [f.request_id for f in faults] == ["r-1"] and engine.aborted == ["r-1"]
        assert await asyncio.wait_for(async_engine.call(lambda e: "still here"), 2) == "still here"
        assert not failures and not async_engine.failed
        async_engine.stop()

    asyncio.run(main())


def test_calls_after_stop_fail_instead_of_waiting():
    async def main() -> None:
        async_engine = await _started(BrokenEngine(RuntimeError("unused")))
        async_engine.stop()
        with pytest.raises(EngineFailed, match="stopped"):
            await asyncio.wait_for(async_engine.call(lambda e: None), 1)

    asyncio.run(main())


def _run_requests(loaded, trigger: FileTrigger | None, faulty: str | None) -> tuple[dict, list[str], object]:
    """Two greedy requests through a real engine; the trigger armed for `faulty` first."""
    async def main():
        engine = make_engine(loaded, token_budget=32, max_chunk_tokens=16)
        async_engine = AsyncEngine(engine, faults=trigger) if trigger else AsyncEngine(engine)
        tokens: dict[str, list[int]] = {"r-1": [], "r-2": []}
        done = asyncio.Event()
        finished: set[str] = set()
        faults: list[str] = []

        def on_step(result: StepResult) -> None:
            for out in result.outputs:
                tokens[out.request_id].extend(out.new_token_ids)
                if out.finished:
                    finished.add(out.request_id)
            for hold in result.holds.values():
                async_engine.release_nowait(hold)
            if finished | set(faults) == {"r-1", "r-2"}:
                done.set()

        def on_fault(fault: RequestFault) -> None:
            faults.append(fault.request_id)
            if finished | set(faults) == {"r-1", "r-2"}:
                done.set()

        async_engine.add_listener(on_step)
        async_engine.add_request_fault_listener(on_fault)
        async_engine.start(asyncio.get_running_loop())
        if trigger is not None:
            trigger.path.write_text(f"request {faulty}")
        for rid, seed in (("r-1", 1), ("r-2", 2)):
            prompt = tiny_prompt(24, loaded.config.vocab_size, seed)
            await async_engine.call(lambda e, rid=rid, prompt=prompt: e.add_request(rid, prompt, GREEDY))
        await asyncio.wait_for(done.wait(), 60)
        await async_engine.call(lambda e: e.scheduler.check_integrity())
        stats = await async_engine.call(lambda e: e.scheduler.stats())
        async_engine.stop()
        return tokens, faults, stats

    return asyncio.run(main())


def test_an_injected_request_fault_fails_only_its_request_in_a_real_engine(tiny_loaded, tmp_path):
    loaded = tiny_loaded["llama_gqa_llama3"]
    baseline, _, _ = _run_requests(loaded, None, None)
    tokens, faults, stats = _run_requests(loaded, FileTrigger(tmp_path / "fault"), "r-1")
    assert faults == ["r-1"]
    assert tokens["r-2"] == baseline["r-2"] and len(baseline["r-2"]) == GREEDY.max_tokens
    assert stats.kv.active == 0 and not (tmp_path / "fault").exists()


def test_an_injected_engine_fault_fails_the_running_request_call(tiny_loaded, tmp_path):
    async def main() -> None:
        loaded = tiny_loaded["llama_gqa_llama3"]
        trigger = FileTrigger(tmp_path / "fault")
        async_engine = AsyncEngine(make_engine(loaded), faults=trigger)
        heard: list[BaseException] = []
        async_engine.add_failure_listener(heard.append)
        async_engine.start(asyncio.get_running_loop())
        trigger.path.touch()
        prompt = tiny_prompt(16, loaded.config.vocab_size, 3)
        await async_engine.call(lambda e: e.add_request("r-1", prompt, GREEDY))
        await async_wait_until(lambda: heard, 30, "the engine failure heard")
        assert len(heard) == 1 and "injected engine fault" in str(heard[0])
        with pytest.raises(EngineFailed):
            await asyncio.wait_for(async_engine.call(lambda e: e.abort("r-1")), 1)
        assert not trigger.path.exists()

    asyncio.run(main())
