"""The worker-client interface over gRPC: wire messages in and out, status codes to WorkerFault."""

from __future__ import annotations

import grpc

from pdserve.aborts import AbortScope, Owner
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.owners import owner_to_pb, scope_to_pb
from pdserve.rpc.stats import identity_from_pb
from pdserve.rpc.convert import finish_from_pb, logprobs_from_pb, priority_to_pb, sampling_to_pb
from pdserve.rpc.errors import FAULT_METADATA, NOBODY, SENDER  # what a worker names as a failure's cause
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.events import Chunk, Departed, Finished, FirstToken, Preempted, Tokens
from router.clients import (
    Call,
    Culprit,
    DecodeClient,
    Departure,
    FaultKind,
    MovedKV,
    PrefillClient,
    Reservation,
    WorkerClients,
    WorkerFault,
    WorkerJob,
    WorkerSnapshot,
)

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
}
_NOBODYS = (FaultKind.TIMEOUT, FaultKind.ABORTED)  # the client's deadline, the client's Abort


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
    kind = _KIND_OF.get(exc.code(), FaultKind.FAILED)
    return WorkerFault(kind, address, message, Culprit.NOBODY if kind in _NOBODYS else Culprit.SELF)


class GrpcCall(Call):
    def __init__(self, call: grpc.aio.UnaryStreamCall, address: str, convert):
        self._call = call
        self._events = call.__aiter__()
        self._address = address
        self._convert = convert

    async def next(self):
        try:
            return self._convert(await self._events.__anext__())
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, self._address) from None

    def close(self) -> None:
        self._call.cancel()


def _worker_request(job: WorkerJob) -> wpb.WorkerRequest:
    return wpb.WorkerRequest(request_id=job.request_id, prompt_token_ids=list(job.prompt),
                             sampling=sampling_to_pb(job.sampling), priority=priority_to_pb(job.priority),
                             kv_timeout_s=job.kv_timeout_s, output_token_ids=list(job.output_token_ids),
                             age_s=job.age_s, owner=owner_to_pb(job.owner) if job.owner is not None else None)


def _decode_event(event: wpb.DecodeEvent):
    kind = event.WhichOneof("event")
    if kind == "tokens":
        t = event.tokens
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
    f = event.finished
    return Finished(finish_from_pb(f.finish_reason), f.cached_tokens, f.preemptions)


def _prefill_event(event: wpb.PrefillEvent):
    if event.WhichOneof("event") == "chunk":
        c = event.chunk
        return Chunk(c.start, c.num_tokens, c.cached_tokens, c.step_seconds)
    d = event.done
    first = logprobs_from_pb(d.first_token_logprobs) if d.HasField("first_token_logprobs") else None
    return FirstToken(d.first_token_id, d.cached_tokens, d.kv_bytes, d.kv_blocks, d.kv_descriptors, d.kv_seconds,
                      d.queue_seconds, first, tuple(logprobs_from_pb(lp) for lp in d.prompt_logprobs))


def _target(r: Reservation) -> wpb.KVReservation:
    return wpb.KVReservation(transfer_id=r.transfer_id, transport=r.transport, kv_address=r.kv_address,
                             block_ids=list(r.block_ids), block_size=r.block_size, block_nbytes=r.block_nbytes,
                             decode_endpoint=r.decode_endpoint, kv_secret=r.secret, num_blocks=r.num_blocks,
                             cached_blocks=r.cached_blocks, identity=r.identity,
                             ranks=[wpb.KVRank(kv_address=a, head_start=s, head_end=e) for a, s, e in r.ranks])


class GrpcDecodeClient(DecodeClient):
    def __init__(self, channel: grpc.aio.Channel, address: str):
        self.address = address
        self._stub = worker_pb2_grpc.DecodeWorkerStub(channel)

    def open(self, job: WorkerJob, local_prefill: bool) -> Call:
        call = self._stub.Decode(wpb.DecodeRequest(request=_worker_request(job), local_prefill=local_prefill),
                                 metadata=job.metadata, timeout=job.timeout_s)
        return GrpcCall(call, self.address, _decode_event)

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return await _match_prefix(self._stub, token_ids, timeout_s)

    async def depart(self, worker_id: str, keep_kv_s: float | None, timeout_s: float) -> Departure:
        request = wpb.DepartRequest(request_id=worker_id, keep_kv=keep_kv_s is not None, keep_kv_s=keep_kv_s or 0.0)
        try:
            reply = await self._stub.Depart(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, self.address) from None
        return Departure(reply.departed, reply.generated, reply.reason, reply.kv_kept)

    async def move_kv(self, worker_id: str, target: Reservation, timeout_s: float) -> MovedKV:
        try:
            reply = await self._stub.MoveKV(wpb.MoveKVRequest(request_id=worker_id, target=_target(target)),
                                            timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, self.address) from None
        return MovedKV(reply.kv_bytes, reply.kv_blocks, reply.kv_seconds)


class GrpcPrefillClient(PrefillClient):
    def __init__(self, channel: grpc.aio.Channel, address: str):
        self.address = address
        self._stub = worker_pb2_grpc.PrefillWorkerStub(channel)

    def open(self, job: WorkerJob, target: Reservation) -> Call:
        call = self._stub.Prefill(wpb.PrefillRequest(request=_worker_request(job), target=_target(target)),
                                  metadata=job.metadata, timeout=job.timeout_s)
        return GrpcCall(call, self.address, _prefill_event)

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return await _match_prefix(self._stub, token_ids, timeout_s)


async def _match_prefix(stub, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
    try:
        reply = await stub.MatchPrefix(wpb.MatchPrefixRequest(token_ids=list(token_ids)), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return None
    return reply.cached_tokens


class GrpcWorkerClients(WorkerClients):
    def __init__(self, channels: ChannelPool):
        self.channels = channels

    def decode(self, address: str) -> DecodeClient:
        return GrpcDecodeClient(self.channels.get(address), address)

    def prefill(self, address: str) -> PrefillClient:
        return GrpcPrefillClient(self.channels.get(address), address)

    async def stats(self, address: str, role: str, timeout_s: float) -> WorkerSnapshot:
        try:
            s = await self._stub(address, role).Stats(wpb.StatsRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, address) from None
        return WorkerSnapshot(free_blocks=s.blocks_free + s.blocks_cached, total_blocks=s.blocks_total,
                              running=s.requests_running, waiting=s.requests_waiting, draining=s.draining,
                              active_blocks=s.blocks_active, queued_prefill_tokens=s.queued_prefill_tokens,
                              prefill_tokens_per_s=s.prefill_tokens_per_s, step_s=s.step_seconds, role=s.role,
                              next_role=s.next_role, elastic=s.elastic, identity=identity_from_pb(s.identity))

    async def set_role(self, address: str, role: str, timeout_s: float) -> tuple[str, str]:
        stub = worker_pb2_grpc.WorkerControlStub(self.channels.get(address))
        try:
            response = await stub.SetRole(wpb.SetRoleRequest(role=role), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, address) from None
        return response.role, response.next_role

    async def abort(self, address: str, role: str, owner: Owner, scope: AbortScope, timeout_s: float) -> bool | None:
        request = wpb.WorkerAbortRequest(owner=owner_to_pb(owner), scope=scope_to_pb(scope))
        try:
            return (await self._stub(address, role).Abort(request, timeout=timeout_s)).found
        except grpc.aio.AioRpcError:
            return None

    async def forget(self, address: str) -> None:
        await self.channels.drop(address)

    def _stub(self, address: str, role: str):
        stub_cls = worker_pb2_grpc.PrefillWorkerStub if role == "prefill" else worker_pb2_grpc.DecodeWorkerStub
        return stub_cls(self.channels.get(address))
