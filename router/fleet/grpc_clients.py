"""The worker-client interface over gRPC: wire messages in and out (router/fleet/grpc_wire.py), status
codes to WorkerFault; a decode call's events by its worker's event feed (router/fleet/grpc_feed.py)."""

from __future__ import annotations

import asyncio

import grpc

from pdserve.aborts import AbortScope, Owner
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.owners import owner_to_pb, scope_to_pb
from pdserve.rpc.stats import identity_from_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from router.fleet.clients import (
    Call,
    DecodeClient,
    Departure,
    MovedKV,
    PrefillClient,
    PushCall,
    Reservation,
    WorkerClients,
    WorkerJob,
    WorkerSnapshot,
)
from pdserve.reattach import HeldAttempt
from router.fleet.grpc_feed import Anchor, FedCall, RouterFeeds
from router.fleet.grpc_wire import decode_event, fault_of, held_from_pb, prefill_event, target_to_pb, worker_request

ABANDON_TIMEOUT_S = 1.0  # an Abort of an attempt this router lets go (a closed reattachable call)


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


class AnchoredCall(GrpcCall):
    """A decode call read one by one, ending its request with an Abort when closed early (Anchor)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, address: str, anchor: Anchor):
        super().__init__(call, address, decode_event)
        self._anchor = anchor

    async def next(self):
        try:
            event = await super().next()
        except StopAsyncIteration:
            self._anchor.over = True
            raise
        self._anchor.saw(event)
        return event

    def close(self) -> None:
        self._anchor.let_go()
        super().close()


class GrpcDecodeClient(DecodeClient):
    def __init__(self, channel: grpc.aio.Channel, address: str, feeds: RouterFeeds | None = None,
                 abandons: set[asyncio.Task] | None = None, feed_channel: grpc.aio.Channel | None = None):
        """`feeds`: this router's event feeds (None: every call carries its own events), opened on
        `feed_channel` (default: `channel`); `abandons`: where the Aborts of attempts it lets go
        run (their tasks, until answered)."""
        self.address = address
        self._stub = worker_pb2_grpc.DecodeWorkerStub(channel)
        self._feed_stub = worker_pb2_grpc.DecodeWorkerStub(feed_channel) if feed_channel is not None else self._stub
        self._feeds = feeds
        self._abandons = abandons if abandons is not None else set()

    def open(self, job: WorkerJob, local_prefill: bool) -> Call | PushCall:
        def decode(feed_id: str) -> grpc.aio.UnaryStreamCall:
            request = wpb.DecodeRequest(request=worker_request(job), local_prefill=local_prefill, feed_id=feed_id)
            return self._stub.Decode(request, metadata=job.metadata, timeout=job.timeout_s)

        return self._anchored(job, decode)

    def attach(self, job: WorkerJob) -> Call | PushCall:
        assert job.owner is not None

        def attach(feed_id: str) -> grpc.aio.UnaryStreamCall:
            request = wpb.AttachRequest(request_id=job.request_id, owner=owner_to_pb(job.owner), feed_id=feed_id)
            return self._stub.Attach(request, metadata=job.metadata, timeout=job.timeout_s)

        return self._anchored(job, attach)

    def _anchored(self, job: WorkerJob, open_call) -> Call | PushCall:
        abandon = (lambda attachment: self._abandon(job.request_id, attachment)) if job.reattachable else None
        if self._feeds is not None:
            return FedCall(self._feeds.of(self.address, self._feed_stub), job.request_id, open_call, abandon)
        return AnchoredCall(open_call(""), self.address, Anchor(abandon))

    def _abandon(self, worker_id: str, attachment: int) -> None:
        task = asyncio.ensure_future(self.abort_attempt(worker_id, attachment, ABANDON_TIMEOUT_S))
        self._abandons.add(task)
        task.add_done_callback(self._abandons.discard)

    async def find(self, owner: Owner, prompt_digest: bytes, timeout_s: float) -> list[HeldAttempt] | None:
        request = wpb.FindRequest(owner=owner_to_pb(owner), prompt_digest=prompt_digest)
        try:
            return held_from_pb(await self._stub.Find(request, timeout=timeout_s), self.address)
        except grpc.aio.AioRpcError as exc:
            return [] if exc.code() == grpc.StatusCode.UNIMPLEMENTED else None  # (a worker from before re-attach)

    async def abort_attempt(self, worker_id: str, attachment: int, timeout_s: float) -> bool | None:
        request = wpb.WorkerAbortRequest(request_id=worker_id, attachment=attachment)
        try:
            return (await self._stub.Abort(request, timeout=timeout_s)).found
        except grpc.aio.AioRpcError:
            return None

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return await _match_prefix(self._stub, token_ids, timeout_s)

    async def depart(self, worker_id: str, keep_kv_s: float | None, timeout_s: float,
                     attachment: int = 0) -> Departure:
        request = wpb.DepartRequest(request_id=worker_id, keep_kv=keep_kv_s is not None, keep_kv_s=keep_kv_s or 0.0,
                                    attachment=attachment)
        try:
            reply = await self._stub.Depart(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, self.address) from None
        return Departure(reply.departed, reply.generated, reply.reason, reply.kv_kept)

    async def move_kv(self, worker_id: str, target: Reservation, timeout_s: float) -> MovedKV:
        try:
            reply = await self._stub.MoveKV(wpb.MoveKVRequest(request_id=worker_id, target=target_to_pb(target)),
                                            timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, self.address) from None
        return MovedKV(reply.kv_bytes, reply.kv_blocks, reply.kv_seconds)


class GrpcPrefillClient(PrefillClient):
    def __init__(self, channel: grpc.aio.Channel, address: str):
        self.address = address
        self._stub = worker_pb2_grpc.PrefillWorkerStub(channel)

    def open(self, job: WorkerJob, target: Reservation | None) -> Call:
        request = wpb.PrefillRequest(request=worker_request(job), target_follows=True) if target is None else \
            wpb.PrefillRequest(request=worker_request(job), target=target_to_pb(target))
        call = self._stub.Prefill(request, metadata=job.metadata, timeout=job.timeout_s)
        return GrpcCall(call, self.address, prefill_event)

    async def set_target(self, worker_id: str, target: Reservation, timeout_s: float) -> None:
        try:
            await self._stub.SetTarget(wpb.SetTargetRequest(request_id=worker_id, target=target_to_pb(target)),
                                       timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise fault_of(exc, self.address) from None

    async def match_prefix(self, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
        return await _match_prefix(self._stub, token_ids, timeout_s)


async def _match_prefix(stub, token_ids: tuple[int, ...], timeout_s: float) -> int | None:
    try:
        reply = await stub.MatchPrefix(wpb.MatchPrefixRequest(token_ids=list(token_ids)), timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return None
    return reply.cached_tokens


class GrpcWorkerClients(WorkerClients):
    def __init__(self, channels: ChannelPool, feeds: bool = True):
        """`feeds`: decode workers send this router's requests' events on one stream each (else
        each request's on its own call)."""
        self.channels = channels
        self.feeds = RouterFeeds() if feeds else None
        self.abandons: set[asyncio.Task] = set()  # Aborts of attempts let go, until answered

    def decode(self, address: str) -> DecodeClient:
        feed_channel = self.channels.feed(address) if self.feeds is not None else None
        return GrpcDecodeClient(self.channels.get(address), address, self.feeds, self.abandons, feed_channel)

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
                              next_role=s.next_role, elastic=s.elastic, identity=identity_from_pb(s.identity),
                              target_follows=s.target_follows, awaiting_target=s.requests_awaiting_target)

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
        if self.feeds is not None:
            self.feeds.forget(address)
        await self.channels.drop(address)

    def _stub(self, address: str, role: str):
        stub_cls = worker_pb2_grpc.PrefillWorkerStub if role == "prefill" else worker_pb2_grpc.DecodeWorkerStub
        return stub_cls(self.channels.get(address))
