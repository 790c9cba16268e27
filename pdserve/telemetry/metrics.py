"""Prometheus metrics of one pdserve process, on a registry the `Metrics` object owns.

Every process (router, prefill, decode) builds one `Metrics`, records with plain Python values
and serves `/metrics` with `serve(port)` (the router's HTTP door serves `exposition()` too).
Label values: enums are labelled by their lowercase name (Priority.VIP -> "vip",
FinishReason.STOP -> "stop", PreemptionMode.SWAP -> "swap"), strings as given.

The families vLLM's users chart (latencies, queue time, running and waiting requests, KV usage,
prefix cache, preemptions, tokens, finished requests) carry `model_name`: the name the model is
served by. With `vllm_names` they are exported under vLLM's names as well (vllm_names.py).
"""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from pdserve.telemetry.buckets import (LATENCY_BUCKETS, RATIO_BUCKETS, TOKEN_LATENCY_BUCKETS, TRANSFER_BUCKETS,
                                      observe_all)
from pdserve.telemetry.latency import TokenTimeline
from pdserve.telemetry.metrics_server import MetricsServer, serve_metrics
from pdserve.telemetry.vllm_names import VllmNames

EXPOSITION_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what `exposition()` is: Prometheus text 0.0.4
KV_BLOCK_STATES = ("free", "active", "cached", "swapped", "held", "reserved", "quarantined")
# held, reserved and quarantined are active blocks under a lease: a KV send reads them, a prefill
# worker writes them, a withdrawn receive may still write them
MODEL = ("model_name",)

Label = enum.Enum | str


def label(value: Label) -> str:
    return value.name.lower() if isinstance(value, enum.Enum) else value


class Metrics:
    """The metric set every pdserve process exports (a role leaves unused ones at zero).

    NOTE: the engine's gauges (running, waiting, KV usage) appear at a worker's first update: a
    router exports none of them, so an average over pods counts workers only.
    """

    def __init__(self, model_name: str = "", vllm_names: bool = False) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self._histograms()
        self._counters()
        self._gauges()
        for family in (self.ttft, self.itl, self.e2e, self.prefix_cache_hit_tokens, self.prefix_cache_query_tokens,
                       self.prompt_tokens, self.generation_tokens):
            family.labels(model_name)  # at zero from the start
        if vllm_names:
            self.registry.register(VllmNames(self.model_families()))

    def model_families(self) -> tuple[Collector, ...]:
        """The metrics labelled by `model_name` (vLLM's names copy these)."""
        return (self.ttft, self.itl, self.e2e, self.queue_time, self.requests, self.preemptions,
                self.prefix_cache_hit_tokens, self.prefix_cache_query_tokens, self.prompt_tokens,
                self.generation_tokens, self.running, self.waiting, self.kv_cache_usage)

    def _histograms(self) -> None:
        r = self.registry
        self.ttft = Histogram(
            "pdserve_time_to_first_token_seconds", "Arrival to first generated token.",
            MODEL, buckets=LATENCY_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "pdserve_inter_token_latency_seconds", "Gap between consecutive token deliveries.",
            MODEL, buckets=TOKEN_LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "pdserve_e2e_request_latency_seconds", "Arrival to the last token.",
            MODEL, buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue_time = Histogram(
            "pdserve_request_queue_time_seconds", "Arrival to first admission by the scheduler.",
            [*MODEL, "priority"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.kv_transfer = Histogram(
            "pdserve_kv_transfer_seconds", "Duration of one request's KV transfer.",
            buckets=TRANSFER_BUCKETS, registry=r,
        )
        self.ttft_predicted = Histogram(
            "pdserve_ttft_predicted_seconds", "Time to first token the router predicted at admission "
            "(pdserve/admission/ttft.py), for requests that then had a first token.",
            ["priority"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.ttft_prediction_ratio = Histogram(
            "pdserve_ttft_measured_over_predicted", "Measured over predicted time to first token, per request "
            "(1: exact; the model's error is visible here).",
            ["priority"], buckets=RATIO_BUCKETS, registry=r,
        )

    def _counters(self) -> None:
        r = self.registry
        self.requests = Counter(
            "pdserve_requests_total", "Finished requests.", [*MODEL, "priority", "finish_reason"],
            registry=r,
        )
        self.preemptions = Counter(
            "pdserve_preemptions_total", "Preemptions by recovery mode.", [*MODEL, "mode"], registry=r,
        )
        self.kv_transfer_bytes = Counter(
            "pdserve_kv_transfer_bytes_total", "KV bytes moved between workers.", registry=r,
        )
        self.kv_peer_paths = Counter(
            "pdserve_kv_peer_connections_total",
            "KV connections this worker opened to a peer worker, by the path chosen for it (host: shared "
            "memory allowed; network: not) and its UCX transports.", ["peer", "path", "transports"], registry=r,
        )
        self.kv_peer_unreachable = Counter(
            "pdserve_kv_peer_unreachable_total",
            "KV sends that failed because nothing reached the peer worker within the connect time.", ["peer"],
            registry=r,
        )
        self.prefix_cache_hit_tokens = Counter(
            "pdserve_prefix_cache_hit_tokens_total", "Prompt tokens a worker's prefix cache held, of its finished "
            "requests.", MODEL, registry=r,
        )
        self.prefix_cache_query_tokens = Counter(
            "pdserve_prefix_cache_query_tokens_total", "Prompt tokens a worker looked up in its prefix cache, of "
            "its finished requests (hit rate: hit over query tokens).", MODEL, registry=r,
        )
        self.prompt_tokens = Counter(
            "pdserve_prompt_tokens_total", "Prompt tokens of finished requests.", MODEL, registry=r,
        )
        self.generation_tokens = Counter(
            "pdserve_generation_tokens_total", "Generated tokens.", MODEL, registry=r,
        )
        self.tenant_requests = Counter(
            "pdserve_tenant_requests_total", "Finished requests by tenant (names come from the tenants file).",
            ["tenant", "finish_reason"], registry=r,
        )
        self.prefill_placements = Counter(
            "pdserve_prefill_placements_total", "Where prompts were prefilled: reason remote (a prefill worker), "
            "cached or prefill_busy (the decode worker itself, conditional disaggregation), colocated, "
            "resume_remote (a resume's prompt and tokens so far, by a prefill worker), resume (by the decode "
            "worker: no prefill worker was usable).",
            ["reason"], registry=r,
        )
        self.admissions = Counter(
            "pdserve_admissions_total", "Admission verdicts (admit, local, defer, refuse) by priority and reason "
            "(no_objective, within, local_within, ttft, tbt, deferred_too_long).",
            ["priority", "verdict", "reason"], registry=r,
        )
        self.incompatible_workers = Counter(
            "pdserve_incompatible_workers_total", "Workers found serving another model than the router's, by role "
            "and by what differs (weights, architecture, tokenizer, identity: none given); each gets no work.",
            ["role", "field"], registry=r,
        )
        self.canaries = Counter(
            "pdserve_canaries_total", "Canaries through prefill-decode pairs, by outcome: agree, differ (the pair "
            "leaves rotation), failed (a fault), unjudged (no reference yet).", ["outcome"], registry=r,
        )
        self.corrupt_kv = Counter(
            "pdserve_kv_checksum_failures_total", "KV that landed other than its sender summed it (the request "
            "went to another pair; the sender was charged).", registry=r,
        )
        self.departures = Counter(
            "pdserve_departures_total", "Requests that left a decode worker leaving its role or draining: "
            "kv_kept (departed, KV kept for a move), prefill_again (departed, prefilled again elsewhere), "
            "kv_moved (the KV landed in the next decode worker).",
            ["outcome"], registry=r,
        )
        self.planner_changes = Counter(
            "pdserve_planner_changes_total", "Role changes the planner made, by direction and reason "
            "(prefill_backlog, decode_waiting, decode_occupancy, decode_tbt).",
            ["from_role", "to_role", "reason"], registry=r,
        )
        self.lease_ends = Counter(
            "pdserve_lease_ends_total", "Leases ended, by kind and how (ended, settled, expired).",
            ["lease", "reason"], registry=r,
        )

    def _gauges(self) -> None:
        r = self.registry
        self.kv_blocks = Gauge(
            "pdserve_kv_blocks", "KV cache blocks by state.", ["state"], registry=r,
        )
        self.running = Gauge(
            "pdserve_requests_running", "Requests holding device KV blocks.", MODEL, registry=r,
        )
        self.waiting = Gauge(
            "pdserve_requests_waiting", "Requests waiting for admission (incl. swapped).", MODEL, registry=r,
        )
        self.kv_cache_usage = Gauge(
            "pdserve_kv_cache_usage_ratio", "Fraction of the device KV blocks in use (active over all; "
            "blocks only the prefix cache keeps count as free).", MODEL, registry=r,
        )
        self.leases = Gauge(
            "pdserve_leases", "Leases a worker holds for other processes, by kind.", ["lease"], registry=r,
        )
        for state in KV_BLOCK_STATES:
            self.kv_blocks.labels(state=state).set(0)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        self.itl.labels(self.model_name).observe(seconds)

    def observe_e2e(self, seconds: float) -> None:
        self.e2e.labels(self.model_name).observe(seconds)

    def observe_queue_time(self, seconds: float, priority: Label) -> None:
        self.queue_time.labels(self.model_name, label(priority)).observe(seconds)

    def observe_timeline(self, timeline: TokenTimeline) -> None:
        """TTFT, every inter-token gap and (when finished) end-to-end time of one request: once, at
        its end, a gap per delivery (a step's tokens arrive as one), never per token."""
        if timeline.ttft is not None:
            self.observe_ttft(timeline.ttft)
        observe_all(self.itl.labels(self.model_name), timeline.inter_token_latencies())
        if timeline.e2e is not None:
            self.observe_e2e(timeline.e2e)

    def observe_kv_transfer(self, seconds: float, nbytes: int) -> None:
        self.kv_transfer.observe(seconds)
        self.kv_transfer_bytes.inc(nbytes)

    def count_kv_peer(self, peer: str, path: Label, transports: str, reached: bool) -> None:
        """A KV connection opened to `peer` (reached) or found unreachable."""
        if reached:
            self.kv_peer_paths.labels(peer=peer, path=label(path), transports=transports).inc()
        else:
            self.kv_peer_unreachable.labels(peer=peer).inc()

    def count_request(self, priority: Label, finish_reason: Label) -> None:
        self.requests.labels(self.model_name, label(priority), label(finish_reason)).inc()

    def count_tenant_request(self, tenant: str, finish_reason: Label) -> None:
        self.tenant_requests.labels(tenant=tenant, finish_reason=label(finish_reason)).inc()

    def count_prefill_placement(self, reason: Label) -> None:
        self.prefill_placements.labels(reason=label(reason)).inc()

    def observe_ttft_prediction(self, predicted_s: float, measured_s: float, priority: Label) -> None:
        self.ttft_predicted.labels(priority=label(priority)).observe(predicted_s)
        if predicted_s > 0:
            self.ttft_prediction_ratio.labels(priority=label(priority)).observe(measured_s / predicted_s)

    def count_admission(self, priority: Label, verdict: Label, reason: Label) -> None:
        self.admissions.labels(priority=label(priority), verdict=label(verdict), reason=label(reason)).inc()

    def count_incompatible_worker(self, role: str, fields: tuple[str, ...]) -> None:
        for name in fields:
            self.incompatible_workers.labels(role, name).inc()

    def count_canary(self, outcome: Label) -> None:
        self.canaries.labels(label(outcome)).inc()

    def count_corrupt_kv(self) -> None:
        self.corrupt_kv.inc()

    def count_departure(self, outcome: Label) -> None:
        self.departures.labels(label(outcome)).inc()

    def count_planner_change(self, from_role: str, to_role: str, reason: str) -> None:
        self.planner_changes.labels(from_role=from_role, to_role=to_role, reason=reason).inc()

    def count_preemption(self, mode: Label, n: int = 1) -> None:
        self.preemptions.labels(self.model_name, label(mode)).inc(n)

    def add_prompt_tokens(self, n: int) -> None:
        self.prompt_tokens.labels(self.model_name).inc(n)

    def add_generation_tokens(self, n: int) -> None:
        self.generation_tokens.labels(self.model_name).inc(n)

    def count_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        """One finished request's prompt looked up in this worker's prefix cache."""
        self.prefix_cache_query_tokens.labels(self.model_name).inc(queried_tokens)
        self.prefix_cache_hit_tokens.labels(self.model_name).inc(hit_tokens)

    def set_kv_blocks(self, *, free: int, active: int, cached: int, swapped: int, held: int = 0,
                      reserved: int = 0, quarantined: int = 0) -> None:
        """Device blocks by state (free + active + cached: all of them) and host blocks (swapped)."""
        for state, count in zip(KV_BLOCK_STATES, (free, active, cached, swapped, held, reserved, quarantined)):
            self.kv_blocks.labels(state=state).set(count)
        total = free + active + cached
        self.kv_cache_usage.labels(self.model_name).set(active / total if total else 0.0)

    def count_lease_end(self, lease: Label, reason: Label) -> None:
        self.lease_ends.labels(lease=label(lease), reason=label(reason)).inc()

    def set_leases(self, lease: Label, count: int) -> None:
        self.leases.labels(lease=label(lease)).set(count)

    def set_queue_sizes(self, *, running: int, waiting: int) -> None:
        self.running.labels(self.model_name).set(running)
        self.waiting.labels(self.model_name).set(waiting)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format, as served on /metrics."""
        return generate_latest(self.registry)

    def serve(self, port: int = 0, host: str = "127.0.0.1") -> MetricsServer:
        """Serve /metrics from a daemon thread; port 0 picks a free port."""
        return serve_metrics(self.registry, port, host)
