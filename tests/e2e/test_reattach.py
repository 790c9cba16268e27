"""A stream continues at the other router when its router dies (pdserve/reattach.py): two routers in
front of one prefill and two decode workers on the tiny model. pdserve.client given both routers,
and an OpenAI client that POSTs again with Last-Event-ID, go on at the other router after a
router is SIGKILLed or SIGSTOPped mid-decode, mid-prefill or mid-migration; every output equals
the same request's run without a fault (greedy), no token lost or repeated; a router restarted on
its port serves again; an orphan nobody takes is aborted when its grace passes; every worker ends
with no block held.

The tests share the fleet and run in order; each leaves both routers serving."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.procs.health import serving, wait_serving
from pdserve.procs.supervisor import Child
from tests.helpers.cluster import cluster_flags
from tests.helpers.metrics import counters, gauge
from tests.helpers.pacing import allow_pacing, pace
from tests.helpers.sse import stream_completion
from tests.helpers.waiting import wait_for, wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(900)]

MAX_POSITIONS = 4096
# A stream still running when the test acts on it (once every stream of the test has its first
# token). NOTE: the tiny model streams 2,000-3,000 tokens a second here; through a router that relays
# tokens straight to the door (the direct take, off for now) 1,500 had ended before the act in some runs.
MAX_TOKENS = 1500
KV_BLOCKS = 2048  # each worker's: every stream of a test at once (16 + 1500 tokens in blocks of 16, 16 streams)
GRACE_S = 20.0  # the decode workers' --reattach-grace-s
KV_TIMEOUT_S = 5.0  # the routers' --kv-timeout: a departed request's KV waits this long for its move
PACE_S = 0.004  # the drain test's decode steps: at most 250 a second
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": MAX_TOKENS}


@dataclass
class Fleet:
    sup: Supervisor
    prefill: Child
    decode: list[Child]
    routers: list[Child]

    def grpc(self, i: int) -> str:
        return f"127.0.0.1:{self.routers[i].port}"

    def client(self, *order: int, timeout_s: float = 300.0) -> Client:
        """A client given the routers in this order (its first stream goes to the first)."""
        return Client([self.grpc(i) for i in order], ClientOptions(timeout_s=timeout_s))

    def workers(self) -> list[tuple[Child, str]]:
        return [(self.prefill, "prefill"), *((d, "decode") for d in self.decode)]

    def blocks(self, field_name: str = "blocks_active") -> dict[str, int]:
        return {w.name: getattr(worker_stats(f"127.0.0.1:{w.port}", role), field_name)
                for w, role in self.workers() if not w.exited()}

    def restart_router(self, i: int) -> None:
        """Start a dead router again on its ports, and wait until it serves."""
        router = self.routers[i]
        router.process.wait(30)
        self.sup.respawn(router)
        self.sup.wait_ready(router, 300)
        wait_serving(self.grpc(i), 60)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_qwen2_bias

    tmp = tmp_path_factory.mktemp("reattach")
    model = str(tiny_qwen2_bias(tmp / "qwen2", max_positions=MAX_POSITIONS))
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    allow_pacing(sup)
    secured = cluster_flags(sup.workdir)
    engine = ["--model", model, "--threads", "1", "--kv-blocks", str(KV_BLOCKS), "--host-kv-blocks", "16",
              "--token-budget", "256", "--max-chunk-tokens", "64"]
    try:
        prefill = sup.spawn("prefill", ["prefill", "--port", "0", *engine, *secured])
        decode = [sup.spawn(f"decode-{i}", ["decode", "--port", "0", "--metrics-port", "0", *engine,
                                            "--reattach-grace-s", str(GRACE_S), *secured]) for i in range(2)]
        addresses = {w.name: f"127.0.0.1:{sup.wait_ready(w, 300)}" for w in (prefill, *decode)}
        routers = [sup.spawn(f"router-{i}", [
            "router", "--port", "0", "--http-port", "0", "--model", model, "--prefill-workers", addresses["prefill"],
            "--decode-workers", f"{addresses['decode-0']},{addresses['decode-1']}", "--kv-timeout", str(KV_TIMEOUT_S),
            "--canary-interval-s", "0", *secured]) for i in range(2)]
        for router in routers:
            wait_serving(f"127.0.0.1:{sup.wait_ready(router, 300)}", 60)
        yield Fleet(sup, prefill, decode, routers)
    finally:
        sup.stop()


def _prompt(i: int) -> str:
    return f"Once upon a time {i}, a scheduler split long prompts into chunks"


_REFERENCE: dict[str, tuple[list[int], str]] = {}


def _reference(fleet: Fleet, prompt: str) -> tuple[list[int], str]:
    """The request's tokens and text without a fault (greedy: what every faulted run must equal)."""
    if prompt not in _REFERENCE:
        _references(fleet, [prompt])
    return _REFERENCE[prompt]


def _references(fleet: Fleet, prompts: list[str]) -> None:
    """The references of `prompts` not known yet, computed side by side (decoded in one batch)."""
    def generate(prompt: str) -> None:
        with fleet.client(1, 0) as client:
            whole = client.generate(prompt, **GREEDY)
        assert whole.finish_reason == "length" and len(whole.token_ids) == MAX_TOKENS
        _REFERENCE[prompt] = (whole.token_ids, whole.text)

    missing = [p for p in dict.fromkeys(prompts) if p not in _REFERENCE]
    with ThreadPoolExecutor(max(1, len(missing))) as pool:
        list(pool.map(generate, missing))


@dataclass
class GrpcRun:
    """One pdserve.client stream, read on a thread: its tokens as they come."""

    prompt: str
    order: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    started: threading.Event = field(default_factory=threading.Event)

    def __call__(self, fleet: Fleet) -> GrpcRun:
        with fleet.client(*self.order) as client:
            for chunk in client.stream(self.prompt, **GREEDY):
                self.tokens.extend(chunk.token_ids)
                self.text += chunk.text
                self.finish = chunk.finish_reason or self.finish
                if self.tokens:
                    self.started.set()
        return self


@dataclass
class HttpRun:
    """One OpenAI stream (tests/helpers/sse.py), read on a thread."""

    prompt: str
    order: tuple[int, ...]
    request_id: str
    result: object = None
    tokens: int = 0  # the client has, by its last event's id
    started: threading.Event = field(default_factory=threading.Event)

    def __call__(self, fleet: Fleet):
        ports = [fleet.routers[i].http_port for i in self.order]
        body = {"model": _model_name(fleet), "prompt": self.prompt, "stream_options": {"include_usage": True},
                **GREEDY}
        self.result = stream_completion(ports, body, self.request_id, on_event=self._saw)
        return self

    def _saw(self, seen) -> None:
        self.tokens = seen.tokens
        if self.tokens:
            self.started.set()


def _model_name(fleet: Fleet) -> str:
    return os.path.basename(fleet.routers[0].argv[fleet.routers[0].argv.index("--model") + 1])


def _no_blocks_held(fleet: Fleet, timeout_s: float = 90.0) -> None:
    wait_until(lambda: set(fleet.blocks().values()) == {0}, timeout_s, "zero active blocks on every worker")


def _run_all(fleet: Fleet, runs: list, act) -> list:
    """Every run on a thread of its own; `act()` once each has its first token; then their ends."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = [pool.submit(run, fleet) for run in runs]
        for run, future in zip(runs, futures):
            wait_for(lambda: run.started.is_set() or future.done(), 120, f"a first token of {run.prompt!r}")
        act()
        return [future.result() for future in futures]


def _check(fleet: Fleet, runs: list) -> None:
    for run in runs:
        tokens, text = _reference(fleet, run.prompt)
        if isinstance(run, GrpcRun):
            assert (run.tokens, run.text, run.finish) == (tokens, text, "length"), run.prompt
        else:
            result = run.result
            assert (result.text, result.finish, result.tokens) == (text, "length", MAX_TOKENS), run.prompt
            assert result.usage["completion_tokens"] == MAX_TOKENS


def test_a_router_sigkilled_mid_decode_loses_no_token_through_either_door_and_serves_again_on_its_port(fleet):
    prompts = [_prompt(i) for i in range(12)]
    _references(fleet, prompts)
    runs = [GrpcRun(p, (0, 1) if i % 3 else (1, 0)) for i, p in enumerate(prompts[:8])]
    runs += [HttpRun(p, (0, 1) if i % 2 else (1, 0), f"kill-{i}") for i, p in enumerate(prompts[8:])]
    cut: list[HttpRun] = []  # OpenAI streams of router 0 still running as it died

    def kill() -> None:
        cut.extend(r for r in runs if isinstance(r, HttpRun) and r.order[0] == 0 and r.tokens < MAX_TOKENS)
        fleet.sup.kill(fleet.routers[0])

    _run_all(fleet, runs, kill)
    _check(fleet, runs)
    assert cut and all(len(r.result.posts) > 1 for r in cut)
    fleet.restart_router(0)
    with fleet.client(0) as client:
        assert client.generate(_prompt(0), **GREEDY).token_ids == _reference(fleet, _prompt(0))[0]
    _no_blocks_held(fleet)


def test_a_router_sigstopped_mid_decode_is_gone_around_and_duplicates_nothing_once_continued(fleet):
    prompts = [_prompt(i) for i in range(6)]
    runs = [GrpcRun(p, (1, 0)) for p in prompts[:4]] + [HttpRun(p, (1, 0), f"stop-{i}")
                                                         for i, p in enumerate(prompts[4:])]
    stopped = fleet.routers[1]
    try:
        _run_all(fleet, runs, lambda: fleet.sup.kill(stopped, signal.SIGSTOP))
    finally:
        fleet.sup.kill(stopped, signal.SIGCONT)
    _check(fleet, runs)
    wait_for(lambda: serving(fleet.grpc(1)), 60, "the continued router serving again")
    with fleet.client(1) as client:
        assert client.generate(_prompt(1), **GREEDY).token_ids == _reference(fleet, _prompt(1))[0]
    _no_blocks_held(fleet)


def test_a_router_sigkilled_mid_prefill_leaves_nothing_and_the_stream_starts_at_the_other(fleet):
    """The prefill worker is held (SIGSTOP) while the request's KV is reserved on a decode worker:
    the router dies with the request in prefill; the client goes on at the other router."""
    prompt = _prompt(20)
    _reference(fleet, prompt)
    run = GrpcRun(prompt, (0, 1))
    os.killpg(fleet.prefill.pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(run, fleet)
            wait_for(lambda: sum(fleet_decode_reserved(fleet)) > 0 or future.done(), 60, "a KV reservation")
            fleet.sup.kill(fleet.routers[0])
            os.killpg(fleet.prefill.pid, signal.SIGCONT)
            future.result()
    finally:
        os.killpg(fleet.prefill.pid, signal.SIGCONT)
    _check(fleet, [run])
    fleet.restart_router(0)
    _no_blocks_held(fleet)


def fleet_decode_reserved(fleet: Fleet) -> list[int]:
    return [worker_stats(f"127.0.0.1:{d.port}", "decode").blocks_reserved for d in fleet.decode]


def test_a_router_sigkilled_as_a_drain_moves_its_streams_loses_no_token(fleet):
    """decode-0 drains (SIGTERM): its streams leave with their KV for decode-1; router 0 dies as it
    moves them (which step each stream is at is the machine's choice; every one ends whole). The
    decode workers are paced (a step at most every 4 ms: 6 s a stream) so that the streams still
    run when the drain is noticed, however fast this machine decodes."""
    prompts = [_prompt(30 + i) for i in range(6)]
    _references(fleet, prompts)
    for decode in fleet.decode:
        pace(fleet.sup, decode, PACE_S)
    runs = [GrpcRun(p, (0, 1)) for p in prompts]
    http = fleet.routers[0].http_port
    drained: list[Child] = []

    def running_some() -> Child | None:
        return next((d for d in fleet.decode if worker_stats(f"127.0.0.1:{d.port}", "decode").requests_running > 0),
                    None)

    def drain_then_kill() -> None:  # a decode worker that decodes some of them (which: the router's choice)
        # a first token comes from the prefill worker: a stream may still be receiving its KV, or
        # queued, on its decode worker then
        drained.append(wait_for(running_some, 60, "a decode worker decoding some of the streams"))
        fleet.sup.kill(drained[0], signal.SIGTERM)
        wait_for(lambda: sum(counters(http, "pdserve_departures").values()) > 0, 60, "router 0 moving streams")
        fleet.sup.kill(fleet.routers[0])

    _run_all(fleet, runs, drain_then_kill)
    _check(fleet, runs)
    drained[0].process.wait(90)
    fleet.sup.respawn(drained[0])
    fleet.sup.wait_ready(drained[0], 300)
    for decode in fleet.decode:
        pace(fleet.sup, decode, 0)
    fleet.restart_router(0)
    _no_blocks_held(fleet, KV_TIMEOUT_S + 90)


def test_an_orphan_nobody_takes_is_aborted_when_its_grace_passes_and_cannot_be_continued_after(fleet):
    prompt = _prompt(40)
    seen: list[int] = []
    with Client(fleet.grpc(0), ClientOptions(timeout_s=300)) as client:  # one router: no failover
        stream = client.stream(prompt, request_id="lapse", **GREEDY)
        seen.extend(next(stream).token_ids)
        expired = _orphans_expired(fleet)
        fleet.sup.kill(fleet.routers[0])
        with pytest.raises(PdserveError):
            list(stream)
    _no_blocks_held(fleet, GRACE_S + 90)
    wait_until(lambda: _orphans_expired(fleet) > expired and not _orphan_leases(fleet), 2 * GRACE_S + 60,
               "the orphan's grace over (its result too, if it finished first)")
    with fleet.client(1) as client, pytest.raises(PdserveError) as lost:
        client.generate(prompt, request_id="lapse", resume_from_token=len(seen), **GREEDY)
    assert lost.value.code == "NOT_FOUND"
    fleet.restart_router(0)
    _no_blocks_held(fleet)


def _orphans_expired(fleet: Fleet) -> float:
    """Graces that passed: an orphan's, or a finished one's result's."""
    return sum(sum(counters(d.metrics_port, "pdserve_lease_ends", where={"lease": kind, "reason": "expired"}).values())
               for d in fleet.decode for kind in ("orphan", "result"))


def _orphan_leases(fleet: Fleet) -> float:
    return sum(gauge(d.metrics_port, "pdserve_leases", {"lease": kind}) for d in fleet.decode
               for kind in ("orphan", "result"))
