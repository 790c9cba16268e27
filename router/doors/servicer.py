"""The public Generation service over gRPC: wire in, router/doors/gateway.py, wire out."""

from __future__ import annotations

from pdserve.errors import InvalidRequestError
from pdserve.rpc.convert import finish_to_pb, logprobs_to_pb, priority_from_pb, sampling_from_pb
from pdserve.tokenizer import ChatMessage
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc
from router.doors.asks import (Ask, AskSizes, ChatPrompt, Output, Prompt, Resume, SampleCount, TextPrompt, TokenPrompt,
                         check_count)
from router.doors.gateway import Gateway
from router.doors.tombstones import AbortOutcome

ABORT_OUTCOMES = {AbortOutcome.ABORTED: pb.ABORT_OUTCOME_ABORTED, AbortOutcome.PENDING: pb.ABORT_OUTCOME_PENDING,
                  AbortOutcome.ENDED: pb.ABORT_OUTCOME_ENDED}


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, gateway: Gateway):
        self.gateway = gateway

    async def Generate(self, request: pb.GenerateRequest, context):
        generation = await self.gateway.admit(context.invocation_metadata(), WireAsk(request), context.time_remaining())
        if traceparent := generation.trace.metadata():  # W3C trace context out: the request's root span
            await context.send_initial_metadata(traceparent)
        async for output in self.gateway.stream(generation):
            yield response_to_pb(generation.request_id, output)

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        outcome = await self.gateway.abort(context.invocation_metadata(), request.request_id)
        return pb.AbortResponse(found=outcome == AbortOutcome.ABORTED, outcome=ABORT_OUTCOMES[outcome])


class WireAsk:
    """A GenerateRequest as the gateway's AskSource: its sizes read straight off the message, then
    the message converted."""

    def __init__(self, request: pb.GenerateRequest):
        self.request = request

    def sizes(self) -> AskSizes:
        r, kind = self.request, self.request.WhichOneof("prompt")
        return AskSizes(r.request_id, r.sampling.stop, len(r.sampling.stop_token_ids),
                        len(r.token_ids.ids) if kind == "token_ids" else None,
                        len(r.messages.messages) if kind == "messages" else None, len(r.prior_token_ids))

    def ask(self) -> Ask:
        r = self.request
        count = SampleCount(r.n if r.HasField("n") else 1, r.best_of if r.HasField("best_of") else None)
        if (message := check_count(count, stream=False)) is not None:  # best_of: sent once all ended
            raise InvalidRequestError(message)
        return Ask(_prompt(r), sampling_from_pb(r.sampling), priority_from_pb(r.priority), r.request_id, count,
                   _resume(r))


def _resume(request: pb.GenerateRequest) -> Resume | None:
    if not request.HasField("resume_from_token"):
        return None
    if not request.prior_token_ids:
        return Resume(request.resume_from_token)
    return Resume(request.resume_from_token, tuple(request.prior_token_ids))


def _prompt(request: pb.GenerateRequest) -> Prompt:
    kind = request.WhichOneof("prompt")
    if kind == "text":
        return TextPrompt(request.text)
    if kind == "token_ids":
        return TokenPrompt(list(request.token_ids.ids))
    if kind == "messages":
        return ChatPrompt([ChatMessage(m.role, m.content) for m in request.messages.messages])
    raise InvalidRequestError("no prompt: set one of text, token_ids or messages")


def response_to_pb(request_id: str, output: Output) -> pb.GenerateResponse:
    response = pb.GenerateResponse(request_id=request_id, token_ids=list(output.token_ids), text=output.text,
                                   index=output.index)
    if output.logprobs:
        response.logprobs.extend(logprobs_to_pb(entry) for entry in output.logprobs)
    if output.prompt_logprobs:
        response.prompt_logprobs.extend(logprobs_to_pb(entry) for entry in output.prompt_logprobs)
    if output.finish is not None:
        u = output.finish.usage
        response.finish_reason = finish_to_pb(output.finish.reason)
        response.usage.CopyFrom(pb.Usage(
            prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens, completion_tokens=u.completion_tokens,
            preemptions=u.preemptions, recompute_preemptions=u.recompute_preemptions,
            swap_preemptions=u.swap_preemptions, kv_transfer_bytes=u.kv_transfer_bytes,
            decode_cached_tokens=u.decode_cached_tokens, local_prefill=u.local_prefill))
    return response
