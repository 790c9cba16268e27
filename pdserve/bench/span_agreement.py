"""A client's latencies against the router's spans, request by request.

A third-party client (AIPerf) records each request's time to first token and inter-token latency
from its side of the wire and names the request by the `X-Request-ID` header it sent; the router's
`pdserve.generate` span carries the same id (`gen_ai.request.id`), its own time to first token and
its end-to-end time. Both define the inter-token latency alike: (end to end - first token) /
(output tokens - 1). The client's figures include what the router never sees (the connection,
HTTP and SSE on both ends), so they should exceed the span's by a small, steady amount.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pdserve.stats import median


@dataclass(frozen=True)
class Latency:
    ttft_ms: float
    itl_ms: float | None  # None: one output token


@dataclass(frozen=True)
class Agreement:
    matched: int
    client_only: int  # the client's requests no span was found for
    ttft_client_p50_ms: float
    ttft_span_p50_ms: float
    ttft_gap_p50_ms: float  # client minus span, request by request
    ttft_gap_max_ms: float
    itl_client_p50_ms: float | None
    itl_span_p50_ms: float | None
    itl_gap_p50_ms: float | None
    itl_gap_max_ms: float | None


def aiperf_records(jsonl: Path, phase: str = "profiling") -> dict[str, Latency]:
    """AIPerf's per-request records of one phase (profile_export.jsonl), by X-Request-ID."""
    out: dict[str, Latency] = {}
    for line in jsonl.read_text().splitlines():
        record = json.loads(line)
        meta, metrics = record["metadata"], record["metrics"]
        if meta.get("benchmark_phase") != phase or meta.get("was_cancelled") or "time_to_first_token" not in metrics:
            continue
        itl = metrics.get("inter_token_latency", {}).get("value")
        out[meta["x_request_id"]] = Latency(metrics["time_to_first_token"]["value"], itl)
    return out


def span_latency(attributes: Mapping[str, object]) -> tuple[str, Latency] | None:
    """(request id, latencies) of a router span that saw a first token, else None."""
    ttft, e2e = attributes.get("gen_ai.latency.time_to_first_token"), attributes.get("gen_ai.latency.e2e")
    tokens, rid = attributes.get("gen_ai.usage.output_tokens"), attributes.get("gen_ai.request.id")
    if ttft is None or e2e is None or not rid:
        return None
    itl = (e2e - ttft) / (tokens - 1) * 1000 if isinstance(tokens, int) and tokens > 1 else None
    return str(rid), Latency(ttft * 1000, itl)


def agreement(client: Mapping[str, Latency], spans: Iterable[Mapping[str, object]]) -> Agreement | None:
    found = dict(filter(None, (span_latency(a) for a in spans)))
    pairs = [(c, found[rid]) for rid, c in client.items() if rid in found]
    if not pairs:
        return None
    ttft_gaps = [c.ttft_ms - s.ttft_ms for c, s in pairs]
    itls = [(c.itl_ms, s.itl_ms) for c, s in pairs if c.itl_ms is not None and s.itl_ms is not None]
    itl_gaps = [c - s for c, s in itls]
    return Agreement(
        len(pairs), len(client) - len(pairs),
        median(c.ttft_ms for c, _ in pairs), median(s.ttft_ms for _, s in pairs),
        median(ttft_gaps), max(ttft_gaps, key=abs),
        median(c for c, _ in itls) if itls else None, median(s for _, s in itls) if itls else None,
        median(itl_gaps) if itl_gaps else None, max(itl_gaps, key=abs) if itl_gaps else None)


def format_agreement(run: str, a: Agreement | None) -> str:
    if a is None:
        return f"{run}: no request matched a router span"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return (f"{run}: {a.matched} requests matched ({a.client_only} without a span)\n"
            f"  TTFT ms   AIPerf p50 {ms(a.ttft_client_p50_ms)}   span p50 {ms(a.ttft_span_p50_ms)}   "
            f"AIPerf - span: p50 {ms(a.ttft_gap_p50_ms)}, largest {ms(a.ttft_gap_max_ms)}\n"
            f"  ITL ms    AIPerf p50 {ms(a.itl_client_p50_ms)}   span p50 {ms(a.itl_span_p50_ms)}   "
            f"AIPerf - span: p50 {ms(a.itl_gap_p50_ms)}, largest {ms(a.itl_gap_max_ms)}")
