"""A decode worker killed mid-stream: its requests resume elsewhere (or fail cleanly), others go on."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import grpc
import pytest

from tests.helpers.streams import stream
from pdserve.cli.supervisor import Supervisor
from pdserve.cli.up import wait_serving
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from tests.helpers.cluster import cluster_flags
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
PROMPTS = [f"Write a short story about a robot named Unit {i}." for i in range(4)]
MAX_TOKENS = 40


def _start(failover: str):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    secured = cluster_flags(sup.workdir)
    children = [sup.spawn(n, [n.split("-")[0], "--port", "0", *ENGINE, *secured])
                for n in ("prefill-0", "decode-0", "decode-1")]
    ports = [sup.wait_ready(c, 240) for c in children]
    router = sup.spawn("router", ["router", "--port", "0", "--prefill-workers", f"127.0.0.1:{ports[0]}",
                                  "--decode-workers", f"127.0.0.1:{ports[1]},127.0.0.1:{ports[2]}",
                                  "--decode-failover", failover, *secured])
    target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
    wait_serving(target, 60)
    return sup, target, children


def _request(text: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=text, sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                    ignore_eos=True))


@pytest.fixture(scope="module")
def reference():
    from pdserve.config import EngineConfig
    from pdserve.engine.llm import LLM
    from pdserve.requests import SamplingParams

    llm = LLM(EngineConfig())
    return [c.token_ids for c in llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                      ignore_eos=True))]


TOKENS_OUT_BEFORE_KILL = 3  # of MAX_TOKENS: the victim dies mid-stream, with tokens already out


class _Counting:
    """A Generate stub that counts the tokens its one stream delivered so far."""

    def __init__(self, stub):
        self.stub, self.tokens = stub, 0

    def Generate(self, request, timeout=None):
        for message in self.stub.Generate(request, timeout=timeout):
            self.tokens += len(message.token_ids)
            yield message


def _run_and_kill(target: str, victim) -> list:
    with grpc.insecure_channel(target) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        counted = [_Counting(stub) for _ in PROMPTS]
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = [pool.submit(_safe_stream, c, _request(p)) for c, p in zip(counted, PROMPTS)]
            _wait_running(victim, 2)
            wait_until(lambda: all(c.tokens >= TOKENS_OUT_BEFORE_KILL for c in counted), 300,
                       f"{TOKENS_OUT_BEFORE_KILL} tokens out on every stream")
            os.killpg(victim.process.pid, signal.SIGKILL)
            return [f.result() for f in futures]


def _wait_running(worker, count: int, timeout_s: float = 120.0) -> None:
    """Until the worker decodes `count` requests: placement spreads them over both decode workers."""
    from pdserve.v1 import worker_pb2 as wpb
    from pdserve.v1 import worker_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
        stub = worker_pb2_grpc.DecodeWorkerStub(channel)
        while time.monotonic() < deadline:
            if stub.Stats(wpb.StatsRequest(), timeout=5).requests_running >= count:
                return
            time.sleep(0.1)
    raise AssertionError(f"{worker.name} never ran {count} requests")


def _safe_stream(stub, request):
    try:
        return stream(stub, request, timeout=400)
    except grpc.RpcError as exc:
        return exc


def test_killed_decode_worker_resumes_requests_with_identical_greedy_output(reference):
    sup, target, children = _start("resume")
    try:
        results = _run_and_kill(target, children[2])
        for result, expected in zip(results, reference):
            assert not isinstance(result, grpc.RpcError), result
            assert tuple(result.token_ids) == tuple(expected)
            assert result.finish_reason == "FINISH_REASON_LENGTH"
    finally:
        sup.stop()


def test_killed_decode_worker_fails_its_streams_unavailable_others_finish():
    sup, target, children = _start("fail")
    try:
        results = _run_and_kill(target, children[2])
        failed = [r for r in results if isinstance(r, grpc.RpcError)]
        finished = [r for r in results if not isinstance(r, grpc.RpcError)]
        assert len(failed) == 2 and len(finished) == 2
        assert all(r.code() == grpc.StatusCode.UNAVAILABLE for r in failed)
        assert all(len(r.token_ids) == MAX_TOKENS for r in finished)
        with grpc.insecure_channel(target) as channel:
            after = stream(generation_pb2_grpc.GenerationStub(channel), _request("Hello"), timeout=200)
        assert len(after.token_ids) == MAX_TOKENS
    finally:
        sup.stop()


LONG_PROMPT = " ".join(f"Line {i}: the prefill worker computes this prompt in small chunks." for i in range(20))


def test_killed_prefill_worker_is_retried_on_another():
    from pdserve.config import EngineConfig
    from pdserve.engine.llm import LLM
    from pdserve.requests import SamplingParams

    expected = LLM(EngineConfig()).generate([LONG_PROMPT], SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                          ignore_eos=True))[0].token_ids
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    try:
        secured = cluster_flags(sup.workdir)
        children = [sup.spawn(n, [n.split("-")[0], "--port", "0", *ENGINE, "--max-chunk-tokens", "16", *secured])
                    for n in ("prefill-0", "prefill-1", "decode-0")]
        ports = [sup.wait_ready(c, 240) for c in children]
        router = sup.spawn("router", ["router", "--port", "0", "--prefill-workers",
                                      f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
                                      "--decode-workers", f"127.0.0.1:{ports[2]}", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        with grpc.insecure_channel(target) as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(_safe_stream, stub, _request(LONG_PROMPT))
                victim = _busy_prefill(children[:2])
                os.killpg(victim.process.pid, signal.SIGKILL)
                result = future.result()
        assert not isinstance(result, grpc.RpcError), result
        assert tuple(result.token_ids) == tuple(expected)
    finally:
        sup.stop()


def _busy_prefill(workers, timeout_s: float = 120.0):
    """The prefill worker that holds the request (16-token chunks keep it busy for a few steps)."""
    from pdserve.v1 import worker_pb2 as wpb
    from pdserve.v1 import worker_pb2_grpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for worker in workers:
            with grpc.insecure_channel(f"127.0.0.1:{worker.port}") as channel:
                stats = worker_pb2_grpc.PrefillWorkerStub(channel).Stats(wpb.StatsRequest(), timeout=5)
            if stats.requests_running or stats.requests_waiting:
                return worker
        time.sleep(0.02)
    raise AssertionError("no prefill worker took the request")
