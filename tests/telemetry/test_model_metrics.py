"""The families vLLM's users chart: labelled by model_name, the KV usage and prefix-cache families,
vLLM's names behind a flag, and every role's Metrics built from its command line."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.checkpoint.source import served_name
from pdserve.cli.main import build_parser
from pdserve.telemetry import Metrics
from pdserve.telemetry.vllm_names import VLLM_ALIASES
from pdserve.worker.observability import metrics_from_args

ROUTER_FAMILIES = ("pdserve_time_to_first_token_seconds", "pdserve_inter_token_latency_seconds",
                   "pdserve_e2e_request_latency_seconds", "pdserve_request_queue_time_seconds",
                   "pdserve_requests", "pdserve_prompt_tokens", "pdserve_generation_tokens")
WORKER_FAMILIES = ("pdserve_requests_running", "pdserve_requests_waiting", "pdserve_kv_cache_usage_ratio",
                   "pdserve_prefix_cache_query_tokens", "pdserve_prefix_cache_hit_tokens", "pdserve_preemptions")


def _record(metrics: Metrics) -> Metrics:
    metrics.observe_ttft(0.2)
    metrics.observe_inter_token(0.03)
    metrics.observe_e2e(1.5)
    metrics.observe_queue_time(0.05, "normal")
    metrics.count_request("normal", "length")
    metrics.add_prompt_tokens(12)
    metrics.add_generation_tokens(4)
    metrics.count_preemption("swap")
    metrics.count_prefix_cache(12, 8)
    metrics.set_kv_blocks(free=5, active=3, cached=2, swapped=1)
    metrics.set_queue_sizes(running=2, waiting=7)
    return metrics


def _families(metrics: Metrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}


def _value(family, name: str, **labels) -> float:
    [value] = [s.value for s in family.samples if s.name == name and labels.items() <= s.labels.items()]
    return value


def test_the_families_vllm_users_chart_carry_model_name():
    families = _families(_record(Metrics("tiny-llama")))
    for name in ROUTER_FAMILIES + WORKER_FAMILIES:
        assert families[name].samples, name
        assert {s.labels.get("model_name") for s in families[name].samples} == {"tiny-llama"}, name
    assert _value(families["pdserve_requests_waiting"], "pdserve_requests_waiting") == 7
    assert _value(families["pdserve_requests"], "pdserve_requests_total", finish_reason="length") == 1


def test_model_families_lists_what_carries_the_label():
    names = {family.name for metric in Metrics().model_families() for family in metric.describe()}
    assert names == set(ROUTER_FAMILIES + WORKER_FAMILIES)


def test_kv_usage_is_active_over_all_device_blocks():
    metrics = Metrics("m")

    def usage() -> float:
        return _value(_families(metrics)["pdserve_kv_cache_usage_ratio"], "pdserve_kv_cache_usage_ratio")

    metrics.set_kv_blocks(free=5, active=3, cached=2, swapped=9)  # swapped blocks are host blocks
    assert usage() == pytest.approx(0.3)
    metrics.set_kv_blocks(free=0, active=0, cached=0, swapped=0)
    assert usage() == 0.0


def test_prefix_cache_counts_queried_and_hit_tokens():
    metrics = Metrics("m")
    metrics.count_prefix_cache(100, 64)
    metrics.count_prefix_cache(20, 0)
    families = _families(metrics)
    assert _value(families["pdserve_prefix_cache_query_tokens"], "pdserve_prefix_cache_query_tokens_total") == 120
    assert _value(families["pdserve_prefix_cache_hit_tokens"], "pdserve_prefix_cache_hit_tokens_total") == 64


def test_the_engine_gauges_wait_for_a_workers_first_update():
    """A router never sets them: it exports none, so averages over pods count workers only; the
    request families are at zero from the start."""
    families = _families(Metrics("m"))
    for name in ("pdserve_requests_running", "pdserve_requests_waiting", "pdserve_kv_cache_usage_ratio"):
        assert families[name].samples == [], name
    assert _value(families["pdserve_time_to_first_token_seconds"], "pdserve_time_to_first_token_seconds_count",
                  model_name="m") == 0


def test_vllm_names_are_off_by_default():
    assert b"vllm:" not in _record(Metrics("m")).exposition()


def test_vllm_names_copy_every_aliased_family_with_its_samples():
    families = _families(_record(Metrics("tiny-llama", vllm_names=True)))
    for alias in VLLM_ALIASES:
        copy, source = families[alias.vllm], families[alias.pdserve]
        assert copy.type == source.type, alias.vllm
        assert [s.value for s in copy.samples] == [s.value for s in source.samples], alias.vllm
        assert {s.labels["model_name"] for s in copy.samples} == {"tiny-llama"}, alias.vllm
    success = families["vllm:request_success"]
    assert _value(success, "vllm:request_success_total", finished_reason="length", model_name="tiny-llama") == 1
    assert _value(families["vllm:kv_cache_usage_perc"], "vllm:kv_cache_usage_perc") == pytest.approx(0.3)
    assert _value(families["vllm:time_to_first_token_seconds"], "vllm:time_to_first_token_seconds_bucket",
                  le="0.3") == 1


def test_vllm_names_read_what_is_recorded_at_scrape_time():
    metrics = Metrics("m", vllm_names=True)
    metrics.add_generation_tokens(3)
    metrics.add_generation_tokens(4)
    assert _value(_families(metrics)["vllm:generation_tokens"], "vllm:generation_tokens_total") == 7


@pytest.mark.parametrize("role", ["router", "prefill", "decode"])
def test_each_role_labels_its_metrics_with_the_served_name(role):
    default = metrics_from_args(build_parser().parse_args([role]))
    assert default.model_name == served_name(None)
    assert b"vllm:" not in default.exposition()
    named = metrics_from_args(build_parser().parse_args([role, "--served-model-name", "chat", "--vllm-metric-names"]))
    assert named.model_name == "chat"
    assert 'vllm:time_to_first_token_seconds_count{model_name="chat"}' in named.exposition().decode()
