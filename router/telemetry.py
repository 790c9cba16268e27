"""One request's root span and metrics, fed by the flow's events (policy-free bookkeeping).

    pdserve.generate (SERVER, root; child of the client's traceparent when given)
      ├─ attributes pdserve.admission*, pdserve.ttft.predicted*   the verdict and its prediction
      │                           (measured over predicted at the end; event admission.deferred)
      ├─ pdserve.placement        decode worker chosen (and the prefill worker)
      ├─ events prefill.chunk     tokens, cached tokens, step seconds
      ├─ pdserve.kv_transfer      bytes, blocks, descriptors, seconds
      ├─ events decode.*          preemption mode and reason, resume
      └─ (prefill and decode workers add their own spans under this one)

Root span attributes in OpenTelemetry's GenAI conventions: gen_ai.operation.name (chat |
text_completion), gen_ai.provider.name, gen_ai.request.model, gen_ai.request.max_tokens /
temperature / top_p / seed, gen_ai.response.id, gen_ai.usage.input_tokens / output_tokens,
gen_ai.response.finish_reasons; beside them the names vLLM's spans use (gen_ai.usage.prompt_tokens
/ completion_tokens, gen_ai.request.id, gen_ai.latency.*), for the dashboards already reading them.
"""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from pdserve.requests import FinishReason
from pdserve.telemetry import Metrics, TokenTimeline, extract_context, inject_metadata
from router.flow.flow_types import ATTACHED, MOVED_KV, Done, Job, Milestone, NewTokens


def _ns(seconds_ago: float = 0.0) -> int:
    return time.time_ns() - int(seconds_ago * 1e9)


class RequestTrace:
    def __init__(self, tracer: trace.Tracer, metrics: Metrics, model: str, client_metadata):
        self.metrics = metrics
        self.model = model
        self.job: Job | None = None
        self.timeline = TokenTimeline(arrival=time.perf_counter())
        self.span = tracer.start_span("pdserve.generate", context=extract_context(client_metadata),
                                      kind=SpanKind.SERVER, attributes={"gen_ai.response.model": model})
        self.context = trace.set_span_in_context(self.span)
        self.tracer = tracer
        self.queue_s = 0.0
        self.kv_s = 0.0
        self.predicted_s: float | None = None  # time to first token predicted at admission
        self.done = False

    def bind(self, job: Job, operation: str = "text_completion") -> None:
        """The request passed validation: record what it asks for. `operation`: the GenAI
        operation name ("chat" for a chat's messages, "text_completion" for a prompt)."""
        self.job = job
        s = job.sampling
        self.span.set_attributes({
            "gen_ai.operation.name": operation, "gen_ai.provider.name": "pdserve",
            "gen_ai.request.model": self.model, "gen_ai.response.id": job.request_id,
            "gen_ai.usage.input_tokens": len(job.prompt),
            "gen_ai.request.id": job.request_id, "gen_ai.request.max_tokens": s.max_tokens,
            "gen_ai.request.temperature": s.temperature, "gen_ai.request.top_p": s.top_p,
            "gen_ai.usage.prompt_tokens": len(job.prompt), "pdserve.priority": job.priority.name.lower(),
            "pdserve.tenant": job.tenant})
        if s.seed is not None:
            self.span.set_attribute("gen_ai.request.seed", s.seed)

    def fail(self, error: BaseException, code: str) -> None:
        """The request ended with a gRPC error status (before or after it started)."""
        if self.done:
            return
        self.span.set_status(Status(StatusCode.ERROR, f"{code}: {error}"))
        self.span.record_exception(error)
        if self.job is None:
            self.done = True
            self.span.end()
        else:
            self.finish(FinishReason.ABORT, self.timeline.num_tokens)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What workers receive: this request's root span as their parent."""
        return tuple(inject_metadata(self.context))

    def on_event(self, event) -> None:
        if isinstance(event, NewTokens):
            if not event.arrived:
                self.timeline.record(time.perf_counter(), len(event.token_ids))
            for at, tokens in event.arrived:  # gathered steps (router/flow/stream.py), each as it came
                self.timeline.record(max(at, self.timeline.last), tokens)
        elif isinstance(event, Milestone):
            self._milestone(event)
        elif isinstance(event, Done):
            self.span.set_attributes({"pdserve.cached_tokens": event.cached_tokens,
                                      "pdserve.preemptions": event.preemptions})

    def _milestone(self, event: Milestone) -> None:
        attrs = {k: v for k, v in event.attributes.items() if v is not None}
        if event.name.startswith("admission"):
            self._admission(event.name, attrs)
            return
        if event.name == "placement":
            self.span.set_attributes({"pdserve.local_prefill": bool(attrs.get("pdserve.local_prefill")),
                                      "pdserve.local_prefill.reason": attrs.get("pdserve.local_prefill.reason", "")})
            if attrs.get("pdserve.local_prefill.reason") not in (MOVED_KV, ATTACHED):  # no prompt computed
                self.metrics.count_prefill_placement(attrs.get("pdserve.local_prefill.reason", "remote"))
        if attrs.get("pdserve.fault_kind") == "corrupt":
            self.metrics.count_corrupt_kv()
        if event.name == "departed":
            self.metrics.count_departure("kv_kept" if attrs.get("pdserve.kv_kept") else "prefill_again")
        elif event.name == "kv_move":
            self.metrics.count_departure("kv_moved")
        if event.name.startswith("placement"):
            self.tracer.start_span(f"pdserve.{event.name}", context=self.context, attributes=attrs,
                                   start_time=_ns(time.perf_counter() - self.timeline.arrival)).end()
        elif event.name == "kv_transfer":
            self.kv_s, self.queue_s = attrs["seconds"], attrs.get("queue_seconds", 0.0)
            self.tracer.start_span("pdserve.kv_transfer", context=self.context, start_time=_ns(self.kv_s),
                                   attributes={f"pdserve.kv.{k}": v for k, v in attrs.items()}).end()
        else:
            self.span.add_event(event.name, attrs)

    def _admission(self, name: str, attrs: dict) -> None:
        """The verdict (counted) and the predicted time to first token (kept, to export with the
        measured one): attributes of the root span; a deferral is an event."""
        assert self.job is not None
        self.metrics.count_admission(self.job.priority, attrs["pdserve.admission"], attrs["pdserve.admission.reason"])
        if name != "admission":
            self.span.add_event(name, attrs)
            return
        self.span.set_attributes(attrs)
        self.predicted_s = attrs.get("pdserve.ttft.predicted_s")

    def finish(self, reason: FinishReason, completion_tokens: int) -> None:
        if self.done:
            return
        self.done = True
        self.timeline.finish(time.perf_counter())
        self._finish_span(reason, completion_tokens)
        self._finish_metrics(reason, completion_tokens)

    def _finish_span(self, reason: FinishReason, completion_tokens: int) -> None:
        t = self.timeline
        attrs = {"gen_ai.usage.output_tokens": completion_tokens, "gen_ai.response.finish_reasons": (reason.value,),
                 "gen_ai.usage.completion_tokens": completion_tokens, "gen_ai.latency.e2e": t.e2e or 0.0,
                 "gen_ai.latency.time_in_queue": self.queue_s, "gen_ai.latency.kv_cache_transfer_time": self.kv_s,
                 "pdserve.finish_reason": reason.value}
        if t.ttft is not None:
            attrs["gen_ai.latency.time_to_first_token"] = t.ttft
            if self.predicted_s:
                attrs["pdserve.ttft.measured_over_predicted"] = t.ttft / self.predicted_s
        summary = t.summary().tbt
        if summary is not None:
            attrs.update({"pdserve.tbt.p50": summary.p50, "pdserve.tbt.p99": summary.p99,
                          "pdserve.tbt.max": summary.max})
        self.span.set_attributes(attrs)
        self.span.end()

    def _finish_metrics(self, reason: FinishReason, completion_tokens: int) -> None:
        assert self.job is not None
        m = self.metrics
        m.observe_timeline(self.timeline)
        if self.predicted_s is not None and self.timeline.ttft is not None:
            m.observe_ttft_prediction(self.predicted_s, self.timeline.ttft, self.job.priority)
        m.observe_queue_time(self.queue_s, self.job.priority)
        m.count_request(self.job.priority, reason)
        m.count_tenant_request(self.job.tenant, reason)
        m.add_prompt_tokens(len(self.job.prompt))
        m.add_generation_tokens(completion_tokens)
