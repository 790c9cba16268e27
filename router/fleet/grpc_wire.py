"""The worker protocol's wire messages as the router's types, and back; failed calls as WorkerFaults."""

from __future__ import annotations

import grpc

from pdserve.rpc.convert import finish_from_pb, logprobs_from_pb, priority_to_pb, sampling_to_pb
from pdserve.rpc.errors import ATTACHED, FAULT_METADATA, NOBODY, SENDER  # what a worker names as a failure's cause
from pdserve.rpc.owners import owner_to_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.reattach import HeldAttempt
from pdserve.worker.events import Attached, Chunk, Departed, Finished, FirstToken, Preempted, Tokens
from router.fleet.clients import Culprit, FaultKind, Reservation, WorkerFault, WorkerJob

_KIND_OF = {
    grpc.StatusCode.UNAVAILABLE: FaultKind.GONE,
    grpc.StatusCode.CANCELLED: FaultKind.GONE,
    grpc.StatusCode.DEADLINE_EXCEEDED: FaultKind.TIMEOUT,
    grpc.StatusCode.INVALID_ARGUMENT: FaultKind.REFUSED,
    grpc.StatusCode.FAILED_PRECONDITION: FaultKind.INCOMPATIBLE,
    grpc.StatusCode.OUT_OF_RANGE: FaultKind.REFUSED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: FaultKind.OVERLOADED,
    grpc.StatusCode.DATA_LOSS: FaultKind.CORRUPT,
    grpc.StatusCode.ABORTED: FaultKind.ABORTED,
    grpc.StatusCode.NOT_FOUND: FaultKind.LOST,
}
# the client's deadline, the client's Abort, a request the worker no longer holds
_NOBODYS = (FaultKind.TIMEOUT, FaultKind.ABORTED, FaultKind.LOST)


def fault_of(exc: grpc.aio.AioRpcError, address: str) -> WorkerFault:
    """A failed call as a WorkerFault. A worker naming its peer as the cause (a prefill worker
    whose decode worker went away) makes the fault the peer's, and GONE whatever its status."""
    message = f"{address}: {exc.code().name}: {exc.details() or ''}".rstrip(": ")
    named = {v for k, v in (exc.trailing_metadata() or ()) if k == FAULT_METADATA}
    if "decode" in named:
        return WorkerFault(FaultKind.GONE, address, message, Culprit.PEER)
    if NOBODY in named:  # the worker gave the request back (it leaves its role): elsewhere, uncharged
        return WorkerFault(FaultKind.WITHDRAWN, address, message)
    if SENDER in named:  # KV landed here other than its sender summed it: the sender's fault
        return WorkerFault(FaultKind.CORRUPT, address, message, Culprit.PEER)
    if ATTACHED in named:  # another router drives the request now
        return WorkerFault(FaultKind.TAKEN, address, message, Culprit.NOBODY)
    kind = _KIND_OF.get(exc.code(), FaultKind.FAILED)
    return WorkerFault(kind, address, message, Culprit.NOBODY if kind in _NOBODYS else Culprit.SELF)


def worker_request(job: WorkerJob) -> wpb.WorkerRequest:
    return wpb.WorkerRequest(request_id=job.request_id, prompt_token_ids=list(job.prompt),
                             sampling=sampling_to_pb(job.sampling), priority=priority_to_pb(job.priority),
                             kv_timeout_s=job.kv_timeout_s, output_token_ids=list(job.output_token_ids),
                             age_s=job.age_s, owner=owner_to_pb(job.owner) if job.owner is not None else None,
                             reattachable=job.reattachable)


def decode_event(event: wpb.DecodeEvent):
    kind = event.WhichOneof("event")
    if kind == "tokens":
        t = event.tokens
        if not t.logprobs and not t.prompt_logprobs:
            return Tokens(tuple(t.token_ids))
        return Tokens(tuple(t.token_ids), tuple(logprobs_from_pb(lp) for lp in t.logprobs),
                      tuple(logprobs_from_pb(lp) for lp in t.prompt_logprobs))
    if kind == "reserved":
        r = event.reserved
        return Reservation(r.transfer_id, r.transport, r.kv_address, tuple(r.block_ids), r.block_size,
                           r.block_nbytes, r.decode_endpoint, r.kv_secret, r.num_blocks, r.cached_blocks,
                           tuple((k.kv_address, k.head_start, k.head_end) for k in r.ranks), r.identity)
    if kind == "preempted":
        p = event.preempted
        return Preempted(p.mode, p.reason, p.phase)
    if kind == "departed":
        return Departed(event.departed.generated, event.departed.kv_kept)
    if kind == "attached":
        return Attached(tuple(event.attached.token_ids), event.attached.attachment)
    f = event.finished
    return Finished(finish_from_pb(f.finish_reason), f.cached_tokens, f.preemptions)


def prefill_event(event: wpb.PrefillEvent):
    if event.WhichOneof("event") == "chunk":
        c = event.chunk
        return Chunk(c.start, c.num_tokens, c.cached_tokens, c.step_seconds)
    d = event.done
    first = logprobs_from_pb(d.first_token_logprobs) if d.HasField("first_token_logprobs") else None
    return FirstToken(d.first_token_id, d.cached_tokens, d.kv_bytes, d.kv_blocks, d.kv_descriptors, d.kv_seconds,
                      d.queue_seconds, first, tuple(logprobs_from_pb(lp) for lp in d.prompt_logprobs))


def target_to_pb(r: Reservation) -> wpb.KVReservation:
    return wpb.KVReservation(transfer_id=r.transfer_id, transport=r.transport, kv_address=r.kv_address,
                             block_ids=list(r.block_ids), block_size=r.block_size, block_nbytes=r.block_nbytes,
                             decode_endpoint=r.decode_endpoint, kv_secret=r.secret, num_blocks=r.num_blocks,
                             cached_blocks=r.cached_blocks, identity=r.identity,
                             ranks=[wpb.KVRank(kv_address=a, head_start=s, head_end=e) for a, s, e in r.ranks])


def held_from_pb(reply: wpb.FindResponse, address: str) -> list[HeldAttempt]:
    return [HeldAttempt(h.request_id, tuple(h.token_ids), h.attachable, h.orphaned, h.attachment, address)
            for h in reply.held]
