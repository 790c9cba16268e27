"""A decode worker killed mid-stream: its requests resume elsewhere (or fail cleanly), others go on;
a prefill worker killed mid-prompt: the request is retried on another.

The workers serve a tiny random model, each step paced to about the embedded model's pace here
(tests/helpers/pacing.py): a stream lasts as long by construction while the workers spend almost no CPU."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import urllib.request

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, Completion, PdserveError
from pdserve.client.results import Collector, now
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.outcomes import outcome
from tests.helpers.pacing import allow_pacing, greedy_outputs, pace_all, tiny_model
from tests.helpers.waiting import wait_for
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(900)]

ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
PROMPTS = [f"Unit {i} is a robot. Write a short story about it." for i in range(4)]  # no shared first tokens
MAX_TOKENS = 96  # long enough that the victim holds two streams at once, however fast it decodes


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory, "failover", max_positions=2048)


def _paced(model: str, names: tuple[str, ...], extra: tuple[str, ...] = ()):
    """A supervisor and its paced workers, named role-index, started."""
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    allow_pacing(sup)
    secured = cluster_flags(sup.workdir)
    try:
        children = [sup.spawn(n, [n.split("-")[0], "--port", "0", *ENGINE, "--model", model, *extra, *secured])
                    for n in names]
        pace_all(sup, children)
        return sup, secured, children, [sup.wait_ready(c, 240) for c in children]
    except BaseException:
        sup.stop()
        raise


def _start(model: str, failover: str):
    sup, secured, children, ports = _paced(model, ("prefill-0", "decode-0", "decode-1"))
    router = sup.spawn("router", ["router", "--port", "0", "--model", model,
                                  "--prefill-workers", f"127.0.0.1:{ports[0]}",
                                  "--decode-workers", f"127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}",
                                  "--decode-failover", failover, "--metrics-port", "0", *secured])
    target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
    wait_serving(target, 60)
    return sup, target, [*children, router]


def _prefill_placements(router) -> dict[str, float]:
    """pdserve_prefill_placements_total by reason, on the router's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10).read().decode()
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(text)
            if family.name == "pdserve_prefill_placements" for s in family.samples if s.name.endswith("_total")}


GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def reference(model):
    return greedy_outputs(model, PROMPTS, MAX_TOKENS)


def _read(client: Client, prompt: str) -> Completion:
    """One stream, read to its end."""
    collector = Collector(now())
    for chunk in client.stream(prompt, **GREEDY):
        collector.add(chunk, now())
    return collector.completion


def _run_and_kill(target: str, decode) -> tuple[list, int]:
    """The four streams' outcomes, a decode worker SIGKILLed the moment it is seen running two of
    them (or more), with how many it held then. Which worker holds which stream is the router's
    choice, so the victim is whichever holds two. A stream a decode worker runs has its first
    token out (the prefill worker's, relayed before the decode worker starts), and none is near
    its end: seen at once, each has most of MAX_TOKENS left, whatever the machine's speed. (The
    test waited for tokens on every stream before the kill: on a fast machine the victim's
    streams could finish while the other worker's were still starting.)"""
    with Client(target, ClientOptions(timeout_s=400)) as client:
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = [pool.submit(outcome, _read, client, p) for p in PROMPTS]
            victim, held = _running(decode, 2)
            os.killpg(victim.process.pid, signal.SIGKILL)
            return [f.result() for f in futures], held


def _stats(worker):
    return worker_stats(f"127.0.0.1:{worker.port}", "decode")


def _running(decode, count: int, timeout_s: float = 120.0):
    """A decode worker running `count` requests at once (of four sent together to two workers,
    one gets at least two, each MAX_TOKENS long), and how many it runs."""

    def found():
        for worker in decode:
            running = _stats(worker).requests_running
            if running >= count:
                return worker, running
        return None

    return wait_for(found, timeout_s, f"a decode worker running {count} requests")


def test_killed_decode_worker_resumes_requests_with_identical_greedy_output(model, reference):
    sup, target, children = _start(model, "resume")
    try:
        results, held = _run_and_kill(target, children[1:3])
        for result, expected in zip(results, reference):
            assert not isinstance(result, PdserveError), result
            assert tuple(result.token_ids) == tuple(expected)
            assert result.finish_reason == "length"
        placed = _prefill_placements(children[3])
        assert placed.get("resume", 0) == 0  # the prefill worker served: no decode worker prefilled a resume
        # each prompt once, and each stream the kill cut again: at least one of the `held` (one near its
        # end when they were counted may finish before the kill lands)
        assert placed.get("remote", 0) + placed.get("resume_remote", 0) >= len(PROMPTS) + 1
    finally:
        sup.stop()


def test_killed_decode_worker_fails_its_streams_unavailable_others_finish(model):
    sup, target, children = _start(model, "fail")
    try:
        results, held = _run_and_kill(target, children[1:3])
        failed = [r for r in results if isinstance(r, PdserveError)]
        finished = [r for r in results if not isinstance(r, PdserveError)]
        # the streams the kill cut fail, the others finish: at least one of the `held` (one near its end
        # when they were counted may finish before the kill lands)
        assert held >= 2 and 1 <= len(failed) <= held and len(failed) + len(finished) == len(PROMPTS)
        assert all(r.code == "UNAVAILABLE" for r in failed)
        assert all(len(r.token_ids) == MAX_TOKENS for r in finished)
        with Client(target, ClientOptions(timeout_s=200)) as client:
            assert len(client.generate("Hello", **GREEDY).token_ids) == MAX_TOKENS
    finally:
        sup.stop()


# About 1,000 tokens: 60 paced prefill steps of 16-token chunks, the window in which the test finds the
# prefill worker busy
LONG_PROMPT = " ".join(f"Line {i}: the prefill worker computes this prompt in small chunks." for i in range(25))


def test_killed_prefill_worker_is_retried_on_another(model):
    expected = greedy_outputs(model, [LONG_PROMPT], MAX_TOKENS)[0]
    sup, secured, children, ports = _paced(model, ("prefill-0", "prefill-1", "decode-0"), ("--max-chunk-tokens", "16"))
    try:
        router = sup.spawn("router", ["router", "--port", "0", "--model", model, "--prefill-workers",
                                      f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
                                      "--decode-workers", f"127.0.0.1:{ports[2]}", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        with Client(target, ClientOptions(timeout_s=400)) as client:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(outcome, client.generate, LONG_PROMPT, **GREEDY)
                victim = _busy_prefill(children[:2])
                os.killpg(victim.process.pid, signal.SIGKILL)
                result = future.result()
        assert not isinstance(result, PdserveError), result
        assert tuple(result.token_ids) == tuple(expected)
    finally:
        sup.stop()


def _busy_prefill(workers, timeout_s: float = 120.0):
    """The prefill worker that holds the request (16-token chunks keep it busy for 60 steps)."""

    def busy(worker) -> bool:
        stats = worker_stats(f"127.0.0.1:{worker.port}", "prefill")
        return stats.requests_running + stats.requests_waiting > 0

    return wait_for(lambda: next((w for w in workers if busy(w)), None), timeout_s,
                    "a prefill worker taking the request", interval_s=0.02)
