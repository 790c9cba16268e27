"""Traces through a real OTLP collector (rotel) and Prometheus metrics, across the three services."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.checkpoint.source import served_name
from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.config import CacheConfig
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.otlp_receivers import GrpcReceiver
from tests.helpers.waiting import wait_for, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
DECODE_BLOCKS = 10  # the decode worker's --kv-blocks
BLOCK_TOKENS = CacheConfig().block_size  # the workers' default


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    spec = importlib.util.find_spec("rotel")
    binary = Path(spec.submodule_search_locations[0]) / "rotel-agent"
    receiver = GrpcReceiver()
    port, tmp = _free_port(), tmp_path_factory.mktemp("rotel")
    proc = subprocess.Popen([str(binary), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{port}",
                             "--otlp-http-endpoint", f"127.0.0.1:{_free_port()}", "--pid-file", str(tmp / "pid"),
                             "--log-file", str(tmp / "log"), "--exporter", "otlp", "--otlp-exporter-endpoint",
                             receiver.endpoint, "--otlp-exporter-protocol", "grpc", "--traces-batch-timeout", "50ms"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.2).close() or True, 15,
                   "the collector accepting OTLP connections")
        yield f"http://127.0.0.1:{port}", receiver
    finally:
        proc.terminate()
        proc.wait(10)
        receiver.stop()


@pytest.fixture(scope="module")
def traced(collector):
    endpoint, receiver = collector
    env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "100", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    sup = Supervisor(env=env)
    common = ["--port", "0", "--metrics-port", "0", "--otlp-traces-endpoint", endpoint, *cluster_flags(sup.workdir)]
    engine = ["--threads", "1", "--token-budget", "256", "--max-chunk-tokens", "64", "--host-kv-blocks", "64"]
    try:
        decode = sup.spawn("decode", ["decode", *common, *engine, "--kv-blocks", str(DECODE_BLOCKS)])
        prefill = sup.spawn("prefill", ["prefill", *common, *engine, "--kv-blocks", "128"])
        d, p = sup.wait_ready(decode, 240), sup.wait_ready(prefill, 240)
        router = sup.spawn("router", ["router", *common, "--prefill-workers", f"127.0.0.1:{p}",
                                      "--decode-workers", f"127.0.0.1:{d}", "--http-port", "0"])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        with Client(target, ClientOptions(timeout_s=300)) as client:
            yield {"client": client, "receiver": receiver, "children": {c.name: c for c in sup.children},
                   "target": target, "http": f"http://127.0.0.1:{router.http_port}"}
    finally:
        sup.stop()


GREEDY = {"temperature": 0, "ignore_eos": True}


@contextlib.contextmanager
def _client_span(trace_id: str, span_id: str):
    """The caller's own span, current while the block runs: the client sends it as traceparent."""
    from opentelemetry import context, trace

    span = trace.NonRecordingSpan(trace.SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                                                    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
    token = context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        context.detach(token)


def _spans_of(receiver, trace_id: str, names: set[str], timeout: float = 20.0):
    def complete():
        spans = [s for s in receiver.sink.spans if s.trace_id == trace_id]
        return spans if names <= {s.name for s in spans} else None

    return wait_for(complete, timeout, f"spans {sorted(names)} of trace {trace_id}")


def test_one_trace_across_three_services_under_the_client_span(traced):
    with _client_span(CLIENT_TRACE, CLIENT_SPAN):
        usage = traced["client"].generate("The capital of France is", max_tokens=8, **GREEDY).usage
    assert usage.completion_tokens == 8
    spans = _spans_of(traced["receiver"], CLIENT_TRACE, {"pdserve.generate", "pdserve.prefill", "pdserve.decode"})
    by_name = {s.name: s for s in spans}
    services = {s.resource["service.name"] for s in spans}
    assert {"pdserve-router", "pdserve-prefill", "pdserve-decode"} <= services
    root = by_name["pdserve.generate"]
    assert root.parent_span_id == CLIENT_SPAN
    a = root.attributes
    assert a["gen_ai.usage.prompt_tokens"] == a["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert a["gen_ai.usage.completion_tokens"] == a["gen_ai.usage.output_tokens"] == 8
    assert list(a["gen_ai.response.finish_reasons"]) == ["length"]
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"]
    assert 0 < a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert a["gen_ai.latency.kv_cache_transfer_time"] > 0
    for key in ("gen_ai.request.id", "gen_ai.request.max_tokens", "gen_ai.request.temperature", "gen_ai.request.top_p",
                "gen_ai.response.model", "gen_ai.latency.time_in_queue", "pdserve.priority", "pdserve.cached_tokens",
                "pdserve.preemptions", "pdserve.finish_reason", "pdserve.tbt.p50", "pdserve.tbt.p99", "pdserve.tbt.max"):
        assert key in a, key
    assert a["pdserve.admission"] == "admit" and a["pdserve.admission.reason"] == "no_objective"
    assert a["pdserve.ttft.predicted_s"] > 0 and a["pdserve.ttft.measured_over_predicted"] > 0
    assert a["pdserve.ttft.predicted.prefill_worker"]
    assert by_name["pdserve.prefill"].parent_span_id == root.span_id
    assert by_name["pdserve.decode"].parent_span_id == root.span_id
    transfer = by_name["pdserve.kv_transfer"].attributes
    assert transfer["pdserve.kv.bytes"] > 0 and transfer["pdserve.kv.descriptors"] >= 1


def test_forced_preemption_shows_as_an_event_with_its_mode(traced):
    """Four streams on the one decode worker, each ending with all but one block of its pool and
    holding two from its start: no two fit the pool to their ends, so once the worker admits a
    second while the first runs it must preempt, however fast or slow it decodes."""
    from pdserve.tokenizer import load_tokenizer

    prompts = [f"Story number {i}: once upon a time, in a town by the sea, there was a lighthouse keeper who"
               for i in range(4)]
    lengths = [len(load_tokenizer(None).encode(p)) for p in prompts]
    max_tokens = (DECODE_BLOCKS - 1) * BLOCK_TOKENS - max(lengths) + 1  # KV at the end: prompt, outputs but one
    final = [-(-(n + max_tokens - 1) // BLOCK_TOKENS) for n in lengths]
    assert max(final) < DECODE_BLOCKS and min(final) + min(-(-n // BLOCK_TOKENS) for n in lengths) > DECODE_BLOCKS
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda t: traced["client"].generate(t, max_tokens=max_tokens, **GREEDY), prompts))
    assert [r.usage.prompt_tokens for r in results] == lengths
    assert all(len(r.token_ids) == max_tokens for r in results)
    assert sum(r.usage.preemptions for r in results) > 0
    events = wait_for(lambda: [e for s in traced["receiver"].sink.spans if s.name == "pdserve.decode"
                               for e in s.events if e[0] == "preemption"], 20, "a preemption event on a decode span")
    assert events[0][1]["mode"] in ("recompute", "swap")


def _metrics(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {s.name + str(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


def test_metrics_count_requests_and_blocks_return_to_zero(traced):
    children = traced["children"]
    ratio = "pdserve_ttft_measured_over_predicted_count[('priority', 'normal')]"
    before = _metrics(children["router"].metrics_port)
    for i in range(3):
        traced["client"].generate(f"Question {i}: what is", max_tokens=4, **GREEDY)
    router = _metrics(children["router"].metrics_port)
    model = str([("model_name", served_name(None))])  # the label of the families vLLM's users chart
    assert router[f"pdserve_time_to_first_token_seconds_count{model}"] - before.get(
        f"pdserve_time_to_first_token_seconds_count{model}", 0) == 3
    assert router[ratio] - before.get(ratio, 0) == 3  # the prediction's error, exported per request
    assert router[f"pdserve_e2e_request_latency_seconds_count{model}"] >= 3
    for name in ("prefill", "decode"):
        port = children[name].metrics_port
        wait_until(lambda: _metrics(port)["pdserve_kv_blocks[('state', 'active')]"] == 0, 30,
                   f"the {name} worker's active KV blocks back to 0")
    assert _metrics(children["prefill"].metrics_port)["pdserve_kv_transfer_bytes_total[]"] > 0


def test_both_doors_answer_with_the_trace_context_of_the_requests_root_span(traced):
    """W3C trace context in and out: a caller's traceparent comes back with its trace id and the
    router's root span (the parent of everything the request did)."""
    import json
    import urllib.request

    import grpc

    from pdserve.v1 import generation_pb2 as pb
    from pdserve.v1 import generation_pb2_grpc

    sent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    with grpc.insecure_channel(traced["target"]) as channel:
        call = generation_pb2_grpc.GenerationStub(channel).Generate(
            pb.GenerateRequest(text="Hello", sampling=pb.SamplingParams(max_tokens=2)), metadata=[("traceparent", sent)],
            timeout=120)
        list(call)
        grpc_back = dict(call.initial_metadata())["traceparent"]
    request = urllib.request.Request(f"{traced['http']}/v1/completions", method="POST",
                                     data=json.dumps({"prompt": "Hello", "max_tokens": 2}).encode(),
                                     headers={"content-type": "application/json", "traceparent": sent})
    with urllib.request.urlopen(request, timeout=120) as answer:
        http_back = answer.headers["traceparent"]
    for back in (grpc_back, http_back):
        version, trace_id, span_id, _ = back.split("-")
        assert (version, trace_id) == ("00", CLIENT_TRACE) and span_id != CLIENT_SPAN
