"""The client's requests and responses on the wire: the only client module with protobuf types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.client.types import Chunk, Message, PdserveError, TokenLogprobs, Usage
from pdserve.requests import Constraint, ConstraintKind, SamplingParams
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

PRIORITIES = {"vip": pb.PRIORITY_VIP, "normal": pb.PRIORITY_NORMAL, "batch": pb.PRIORITY_BATCH}
SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))
_FINISH = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length", pb.FINISH_REASON_ABORT: "abort"}


def request_of(prompt: str | None, messages: Sequence[Message | Mapping] | None, token_ids: Sequence[int] | None,
               priority: str | None, request_id: str | None, sampling: Mapping[str, object],
               resume_from_token: int | None = None, prior_token_ids: Sequence[int] = ()) -> pb.GenerateRequest:
    """Exactly one of prompt (raw text), messages (chat) or token_ids; sampling: SamplingParams'
    field names (max_tokens, temperature, ...), unset ones take the server's defaults, and `n`,
    `best_of` (samples: each chunk names its `index`). `resume_from_token`: continue the request
    of that id after as many of its tokens (`prior_token_ids`, when the caller has them)."""
    if sum(x is not None for x in (prompt, messages, token_ids)) != 1:
        raise ValueError("give exactly one of prompt, messages or token_ids")
    sampling = dict(sampling)
    counts = {k: sampling.pop(k) for k in ("n", "best_of") if sampling.get(k) is not None}  # samples, not settings
    unknown = set(sampling) - SAMPLING_FIELDS
    if unknown:
        raise TypeError(f"unknown sampling settings: {', '.join(sorted(unknown))}")
    request = pb.GenerateRequest(sampling=_sampling(sampling), request_id=request_id or "", **counts)
    if resume_from_token is not None:
        request.resume_from_token = resume_from_token
        request.prior_token_ids.extend(prior_token_ids)
    if priority is not None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        request.priority = PRIORITIES[priority]
    if prompt is not None:
        request.text = prompt
    elif token_ids is not None:
        request.token_ids.ids.extend(token_ids)
    else:
        for m in messages:
            role, content = (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])
            request.messages.messages.add(role=role, content=content)
    return request


def _sampling(settings: Mapping[str, object]) -> pb.SamplingParams:
    message = pb.SamplingParams()
    for name, value in settings.items():
        if value is None:
            continue
        if name in ("stop", "stop_token_ids"):
            getattr(message, name).extend([value] if isinstance(value, str) else value)
        elif name == "logit_bias":  # a mapping (or pairs) of token id -> bias
            message.logit_bias.update({int(t): float(b) for t, b in dict(value).items()})
        elif name == "constraint":  # a pdserve.requests.Constraint: structured output
            message.structured_output.CopyFrom(constraint_to_pb(value))
        else:
            setattr(message, name, value)
    return message


def constraint_to_pb(c: Constraint) -> pb.StructuredOutput:
    """A structured-output constraint on the public proto (the router's wire uses it too)."""
    if c.kind is ConstraintKind.JSON_OBJECT:
        return pb.StructuredOutput(json_object=True)
    if c.kind is ConstraintKind.CHOICE:
        return pb.StructuredOutput(choice=pb.Choices(choices=list(c.choices)))
    return pb.StructuredOutput(**{c.kind.value: c.spec})


def resumed(request: pb.GenerateRequest, tokens: Sequence[int]) -> pb.GenerateRequest:
    """The same request, continued after the client's `tokens` (at whichever router takes it)."""
    again = pb.GenerateRequest()
    again.CopyFrom(request)
    again.resume_from_token = len(tokens)
    del again.prior_token_ids[:]
    again.prior_token_ids.extend(tokens)
    return again


def samples_of(request: pb.GenerateRequest) -> int:
    """Samples it draws (a stream of several cannot be continued)."""
    return max(request.n if request.HasField("n") else 1, request.best_of if request.HasField("best_of") else 1)


def with_id(request: pb.GenerateRequest, request_id: str) -> pb.GenerateRequest:
    """`request` under `request_id` when it has none (one it can be continued by)."""
    if not request.request_id:
        request.request_id = request_id
    return request


def chunk_of(response: pb.GenerateResponse) -> Chunk:
    logprobs = _logprobs(response.logprobs)
    prompt = _logprobs(response.prompt_logprobs)
    if not response.finish_reason:
        return Chunk(response.request_id, tuple(response.token_ids), response.text, logprobs, index=response.index,
                     prompt_logprobs=prompt)
    u = response.usage
    usage = Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.preemptions, u.recompute_preemptions,
                  u.swap_preemptions, u.kv_transfer_bytes, u.decode_cached_tokens, u.local_prefill)
    return Chunk(response.request_id, tuple(response.token_ids), response.text, logprobs,
                 _FINISH.get(response.finish_reason, "unknown"), usage, response.index, prompt)


def _logprobs(entries) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(e.token_id, e.logprob, tuple((t.token_id, t.logprob) for t in e.top)) for e in entries)


RETRY_PUSHBACK = "grpc-retry-pushback-ms"  # the server's hint of when to try again (gRFC A6)


def error_of(exc: grpc.RpcError) -> PdserveError:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    return PdserveError(code.name if code is not None else "UNKNOWN", details or "", _retry_after_s(exc))


def _retry_after_s(exc: grpc.RpcError) -> float | None:
    trailers = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else None
    for key, value in trailers or ():
        if key == RETRY_PUSHBACK:
            try:
                return int(value) / 1000.0
            except (TypeError, ValueError):
                return None
    return None


def generation_stub(channel: grpc.Channel | grpc.aio.Channel) -> generation_pb2_grpc.GenerationStub:
    return generation_pb2_grpc.GenerationStub(channel)


def health_stub(channel: grpc.Channel | grpc.aio.Channel) -> health_pb2_grpc.HealthStub:
    return health_pb2_grpc.HealthStub(channel)


def abort_request(request_id: str) -> pb.AbortRequest:
    return pb.AbortRequest(request_id=request_id)


def abort_outcome(response: pb.AbortResponse) -> str:
    """What an Abort found: "aborted" (it was running), "pending" (not seen yet: it ends on
    arrival), "ended" (over already), or "unspecified" (a router that does not say)."""
    return pb.AbortOutcome.Name(response.outcome).removeprefix("ABORT_OUTCOME_").lower()


def health_request(service: str) -> health_pb2.HealthCheckRequest:
    return health_pb2.HealthCheckRequest(service=service)


def is_serving(response: health_pb2.HealthCheckResponse) -> bool:
    return response.status == health_pb2.HealthCheckResponse.SERVING
