import urllib.request

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from pdserve.requests import FinishReason, PreemptionMode, Priority
from pdserve.telemetry import Metrics, TokenTimeline

HISTOGRAMS = (
    "pdserve_time_to_first_token_seconds",
    "pdserve_inter_token_latency_seconds",
    "pdserve_e2e_request_latency_seconds",
    "pdserve_request_queue_time_seconds",
    "pdserve_kv_transfer_seconds",
)
COUNTERS = (
    "pdserve_requests_total",
    "pdserve_preemptions_total",
    "pdserve_kv_transfer_bytes_total",
    "pdserve_prefix_cache_hit_tokens_total",
    "pdserve_prefix_cache_query_tokens_total",
    "pdserve_prompt_tokens_total",
    "pdserve_generation_tokens_total",
)
GAUGES = ("pdserve_kv_blocks", "pdserve_requests_running", "pdserve_requests_waiting", "pdserve_kv_cache_usage_ratio")
M = ("model_name", "m")  # the label of the families vLLM's users chart, as these tests name the model


def _samples(text):
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _families(text):
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def _exercise(metrics):
    metrics.observe_ttft(0.2)
    metrics.observe_inter_token(0.03)
    metrics.observe_e2e(2.5)
    metrics.observe_queue_time(0.05, Priority.VIP)
    metrics.observe_kv_transfer(0.004, nbytes=1 << 20)
    metrics.count_request(Priority.BATCH, FinishReason.LENGTH)
    metrics.count_request("vip", "stop")
    metrics.count_preemption(PreemptionMode.SWAP)
    metrics.count_preemption("recompute", n=2)
    metrics.add_prompt_tokens(37)
    metrics.add_generation_tokens(8)
    metrics.count_prefix_cache(40, 32)
    metrics.set_kv_blocks(free=10, active=5, cached=3, swapped=2)
    metrics.set_queue_sizes(running=4, waiting=6)


def test_exposition_has_every_name_with_its_type():
    metrics = Metrics("m")
    _exercise(metrics)
    text = metrics.exposition().decode()
    families = _families(text)
    for name in HISTOGRAMS:
        assert families[name] == "histogram"
    for name in COUNTERS:
        assert families[name.removesuffix("_total")] == "counter"
        assert f"\n{name}" in text
    for name in GAUGES:
        assert families[name] == "gauge"


def test_recorded_values_and_labels():
    metrics = Metrics("m")
    _exercise(metrics)
    samples = _samples(metrics.exposition().decode())
    assert samples[("pdserve_requests_total", (("finish_reason", "length"), M, ("priority", "batch")))] == 1
    assert samples[("pdserve_requests_total", (("finish_reason", "stop"), M, ("priority", "vip")))] == 1
    assert samples[("pdserve_preemptions_total", (("mode", "swap"), M))] == 1
    assert samples[("pdserve_preemptions_total", (("mode", "recompute"), M))] == 2
    assert samples[("pdserve_kv_transfer_bytes_total", ())] == 1 << 20
    assert samples[("pdserve_prefix_cache_hit_tokens_total", (M,))] == 32
    assert samples[("pdserve_prefix_cache_query_tokens_total", (M,))] == 40
    assert samples[("pdserve_request_queue_time_seconds_count", (M, ("priority", "vip")))] == 1
    assert samples[("pdserve_time_to_first_token_seconds_sum", (M,))] == pytest.approx(0.2)
    assert samples[("pdserve_time_to_first_token_seconds_bucket", (("le", "0.3"), M))] == 1
    assert samples[("pdserve_time_to_first_token_seconds_bucket", (("le", "0.15"), M))] == 0
    for state, count in (("free", 10), ("active", 5), ("cached", 3), ("swapped", 2)):
        assert samples[("pdserve_kv_blocks", (("state", state),))] == count
    assert samples[("pdserve_requests_waiting", (M,))] == 6
    assert samples[("pdserve_kv_cache_usage_ratio", (M,))] == pytest.approx(5 / 18)


def test_kv_block_states_are_exported_before_the_first_update():
    samples = _samples(Metrics().exposition().decode())
    states = {labels[0][1] for name, labels in samples if name == "pdserve_kv_blocks"}
    assert states == {"free", "active", "cached", "swapped", "held", "reserved", "quarantined"}


def test_buckets_span_milliseconds_to_minutes():
    samples = _samples(Metrics().exposition().decode())
    bounds = {
        float(dict(labels)["le"])
        for name, labels in samples
        if name == "pdserve_e2e_request_latency_seconds_bucket"
    }
    assert min(bounds) <= 0.001 and 300 <= max(b for b in bounds if b != float("inf"))


def test_observe_timeline_feeds_three_histograms():
    metrics = Metrics("m")
    timeline = TokenTimeline(arrival=10.0)
    for now in (10.5, 10.52, 10.56):
        timeline.record(now)
    timeline.finish(10.6)
    metrics.observe_timeline(timeline)
    samples = _samples(metrics.exposition().decode())
    assert samples[("pdserve_time_to_first_token_seconds_sum", (M,))] == pytest.approx(0.5)
    assert samples[("pdserve_inter_token_latency_seconds_count", (M,))] == 2
    assert samples[("pdserve_inter_token_latency_seconds_sum", (M,))] == pytest.approx(0.06)
    assert samples[("pdserve_e2e_request_latency_seconds_sum", (M,))] == pytest.approx(0.6)


def test_registries_are_private():
    first, second = Metrics("m"), Metrics("m")
    first.add_prompt_tokens(5)
    assert _samples(second.exposition().decode())[("pdserve_prompt_tokens_total", (M,))] == 0
    assert REGISTRY.get_sample_value("pdserve_prompt_tokens_total") is None


@pytest.mark.timeout(30)
def test_serve_on_a_free_port_then_stop():
    metrics = Metrics("m")
    metrics.add_generation_tokens(3)
    server = metrics.serve(0)
    try:
        assert server.port > 0
        with urllib.request.urlopen(server.url, timeout=10) as reply:
            assert reply.status == 200
            text = reply.read().decode()
    finally:
        server.stop()
    assert _samples(text)[("pdserve_generation_tokens_total", (M,))] == 3
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)
