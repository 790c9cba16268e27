"""Proto <-> core conversions, in one place. Unset optional fields take documented defaults."""

from __future__ import annotations

from pdserve.client.wire import constraint_to_pb  # the public proto's, one conversion for both sides
from pdserve.requests import Constraint, ConstraintKind, FinishReason, Priority, SamplingParams, TokenLogprobs
from pdserve.v1 import generation_pb2 as pb

DEFAULT_SAMPLING = SamplingParams()

_PRIORITY_FROM_PB = {
    pb.PRIORITY_UNSPECIFIED: Priority.NORMAL,
    pb.PRIORITY_VIP: Priority.VIP,
    pb.PRIORITY_NORMAL: Priority.NORMAL,
    pb.PRIORITY_BATCH: Priority.BATCH,
}
_PRIORITY_TO_PB = {Priority.VIP: pb.PRIORITY_VIP, Priority.NORMAL: pb.PRIORITY_NORMAL, Priority.BATCH: pb.PRIORITY_BATCH}
_FINISH_TO_PB = {
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
}
_FINISH_FROM_PB = {v: k for k, v in _FINISH_TO_PB.items()}


class WireError(ValueError):
    """A message that cannot be turned into a core value (maps to INVALID_ARGUMENT)."""


def priority_from_pb(value: int) -> Priority:
    try:
        return _PRIORITY_FROM_PB[value]
    except KeyError:
        raise WireError(f"unknown priority value {value}; use PRIORITY_VIP, PRIORITY_NORMAL or PRIORITY_BATCH") from None


def priority_to_pb(priority: Priority) -> int:
    return _PRIORITY_TO_PB[priority]


def finish_to_pb(reason: FinishReason | None) -> int:
    return _FINISH_TO_PB[reason] if reason else pb.FINISH_REASON_UNSPECIFIED


def finish_from_pb(value: int) -> FinishReason:
    return _FINISH_FROM_PB.get(value, FinishReason.ABORT)


def _opt(msg: pb.SamplingParams, name: str, default):
    return getattr(msg, name) if msg.HasField(name) else default


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    d = DEFAULT_SAMPLING
    return SamplingParams(
        max_tokens=int(_opt(msg, "max_tokens", d.max_tokens)),
        temperature=float(_opt(msg, "temperature", d.temperature)),
        top_p=float(_opt(msg, "top_p", d.top_p)),
        top_k=int(_opt(msg, "top_k", d.top_k)),
        min_p=float(_opt(msg, "min_p", d.min_p)),
        seed=int(msg.seed) if msg.HasField("seed") else None,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=bool(msg.ignore_eos),
        logprobs=int(msg.logprobs) if msg.HasField("logprobs") else None,
        presence_penalty=float(_opt(msg, "presence_penalty", d.presence_penalty)),
        frequency_penalty=float(_opt(msg, "frequency_penalty", d.frequency_penalty)),
        repetition_penalty=float(_opt(msg, "repetition_penalty", d.repetition_penalty)),
        logit_bias=tuple(sorted((int(t), float(b)) for t, b in msg.logit_bias.items())),
        min_tokens=int(_opt(msg, "min_tokens", d.min_tokens)),
        constraint=constraint_from_pb(msg.structured_output) if msg.HasField("structured_output") else None,
        prompt_logprobs=int(msg.prompt_logprobs) if msg.HasField("prompt_logprobs") else None,
    )


def constraint_from_pb(msg: pb.StructuredOutput) -> Constraint:
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise WireError("structured_output sets no constraint: set one of json_schema, json_object, regex, "
                        "grammar or choice")
    if kind == "json_object":
        if not msg.json_object:
            raise WireError("structured_output.json_object must be true when it is the constraint")
        return Constraint(ConstraintKind.JSON_OBJECT)
    if kind == "choice":
        return Constraint(ConstraintKind.CHOICE, choices=tuple(msg.choice.choices))
    return Constraint(ConstraintKind(kind), getattr(msg, kind))


def sampling_to_pb(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
        top_k=params.top_k, min_p=params.min_p, stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids), ignore_eos=params.ignore_eos,
    )
    if params.seed is not None:
        msg.seed = params.seed
    if params.logprobs is not None:
        msg.logprobs = params.logprobs
    if params.prompt_logprobs is not None:
        msg.prompt_logprobs = params.prompt_logprobs
    if params.adjusts_logits:
        msg.presence_penalty, msg.frequency_penalty = params.presence_penalty, params.frequency_penalty
        msg.repetition_penalty, msg.min_tokens = params.repetition_penalty, params.min_tokens
        msg.logit_bias.update(dict(params.logit_bias))
    if params.constraint is not None:
        msg.structured_output.CopyFrom(constraint_to_pb(params.constraint))
    return msg


def logprobs_to_pb(lp: TokenLogprobs) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(token_id=lp.token_id, logprob=lp.logprob,
                            top=[pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top])


def logprobs_from_pb(msg: pb.TokenLogprobs) -> TokenLogprobs:
    """Floats as the wire carries them (float32)."""
    top = tuple((int(t.token_id), float(t.logprob)) for t in msg.top)
    return TokenLogprobs(int(msg.token_id), float(msg.logprob), top)
