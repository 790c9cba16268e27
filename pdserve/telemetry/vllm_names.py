"""vLLM's names for the families its users chart, as a second view of pdserve's own
(`--vllm-metric-names`): dashboards and autoscaling rules written for vLLM read pdserve unchanged.

Each vLLM family is a renamed copy of a pdserve family, made at scrape time: the same type,
samples, unit and labels (`model_name` among them), a label renamed where vLLM spells it
otherwise. Nothing is recorded twice. Where vLLM renamed a family, both of its names are here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class Alias(NamedTuple):
    vllm: str  # vLLM's family name (a counter's without `_total`)
    pdserve: str  # the pdserve family it copies
    labels: tuple[tuple[str, str], ...] = ()  # (pdserve label, vLLM's spelling of it)


VLLM_ALIASES = (
    Alias("vllm:time_to_first_token_seconds", "pdserve_time_to_first_token_seconds"),
    Alias("vllm:inter_token_latency_seconds", "pdserve_inter_token_latency_seconds"),
    Alias("vllm:time_per_output_token_seconds", "pdserve_inter_token_latency_seconds"),  # older vLLM
    Alias("vllm:e2e_request_latency_seconds", "pdserve_e2e_request_latency_seconds"),
    Alias("vllm:request_queue_time_seconds", "pdserve_request_queue_time_seconds"),
    Alias("vllm:num_requests_running", "pdserve_requests_running"),
    Alias("vllm:num_requests_waiting", "pdserve_requests_waiting"),
    Alias("vllm:kv_cache_usage_perc", "pdserve_kv_cache_usage_ratio"),  # a fraction, as vLLM's
    Alias("vllm:gpu_cache_usage_perc", "pdserve_kv_cache_usage_ratio"),  # older vLLM
    Alias("vllm:prefix_cache_queries", "pdserve_prefix_cache_query_tokens"),
    Alias("vllm:prefix_cache_hits", "pdserve_prefix_cache_hit_tokens"),
    Alias("vllm:num_preemptions", "pdserve_preemptions"),
    Alias("vllm:prompt_tokens", "pdserve_prompt_tokens"),
    Alias("vllm:generation_tokens", "pdserve_generation_tokens"),
    Alias("vllm:request_success", "pdserve_requests", (("finish_reason", "finished_reason"),)),
)


class VllmNames(Collector):
    """Collects `VLLM_ALIASES` from `metrics` (the pdserve metric objects they name); register it
    on the registry that holds those."""

    def __init__(self, metrics: Iterable[Collector]):
        self._sources = {family.name: metric for metric in metrics for family in metric.describe()}
        missing = {a.pdserve for a in VLLM_ALIASES} - set(self._sources)
        assert not missing, f"vLLM aliases of families not given: {sorted(missing)}"

    def collect(self) -> Iterator[Metric]:
        for alias in VLLM_ALIASES:
            for family in self._sources[alias.pdserve].collect():
                yield renamed(family, alias)

    def describe(self) -> Iterator[Metric]:
        for alias in VLLM_ALIASES:
            for family in self._sources[alias.pdserve].describe():
                yield renamed(family, alias)


def renamed(family: Metric, alias: Alias) -> Metric:
    """`family` under `alias.vllm`, its samples' suffixes (`_bucket`, `_total`, ...) kept."""
    copy = Metric(alias.vllm, family.documentation, family.type, family.unit)
    spelling = dict(alias.labels)
    copy.samples = [s._replace(name=alias.vllm + s.name.removeprefix(family.name),
                               labels={spelling.get(k, k): v for k, v in s.labels.items()})
                    for s in family.samples]
    return copy
