"""A worker's metrics feed: prefix-cache lookups and preemptions from engine steps, KV usage and
queue sizes from the engine's statistics, all under the served model's name."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.engine.outputs import RequestOutput, StepResult
from pdserve.kv.manager import KVStats
from pdserve.requests import PreemptionMode, Request
from pdserve.scheduler.output import Preemption
from pdserve.scheduler.results import SchedulerStats
from pdserve.telemetry import Metrics
from pdserve.worker.leases import Leases
from pdserve.worker.metrics_feed import MetricsFeed


class FakeEngine:
    def __init__(self, stats: SchedulerStats):
        self.stats = stats
        self.listeners = []

    def add_listener(self, listener) -> None:
        self.listeners.append(listener)


def _samples(metrics: Metrics) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(metrics.exposition().decode())
            for s in f.samples if s.labels.get("model_name") == "m" and not s.name.endswith("_created")}


def _step(outputs=(), preemptions=()) -> StepResult:
    return StepResult(outputs=tuple(outputs), preemptions=tuple(preemptions), resumed=(), chunks=(), num_tokens=0,
                      seconds=0.01)


def test_finished_requests_count_their_prompt_lookups_and_preemptions_their_mode():
    metrics = Metrics("m")
    feed = MetricsFeed(FakeEngine(None), metrics, Leases())
    done = Request("a", list(range(40)), num_cached_tokens=32)
    running = Request("b", list(range(16)), num_cached_tokens=16)
    feed.on_step(_step([RequestOutput(done, (7,), finished=True), RequestOutput(running, (8,), finished=False)],
                       [Preemption(running, PreemptionMode.SWAP, "out_of_blocks")]))
    samples = _samples(metrics)
    assert (samples["pdserve_prefix_cache_query_tokens_total"], samples["pdserve_prefix_cache_hit_tokens_total"]) \
        == (40, 32)
    assert samples["pdserve_preemptions_total"] == 1


def test_refresh_sets_kv_usage_and_queue_sizes():
    kv = KVStats(free=50, active=30, cached=20, swapped=4, total=100, host_total=16)
    metrics = Metrics("m")
    feed = MetricsFeed(FakeEngine(SchedulerStats(running=3, waiting=2, swapped=1, kv=kv, receiving=1)), metrics,
                       Leases())
    asyncio.run(feed.refresh())
    samples = _samples(metrics)
    assert samples["pdserve_kv_cache_usage_ratio"] == pytest.approx(0.3)
    assert (samples["pdserve_requests_running"], samples["pdserve_requests_waiting"]) == (4, 3)
