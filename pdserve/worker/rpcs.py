"""What both worker roles' servicers share: their common fields and the RPCs they answer alike
(MatchPrefix, Abort, Stats). Each servicer inherits it, sets `role` and adds its own streams."""

from __future__ import annotations

from typing import Protocol

from opentelemetry import trace

from pdserve.engine.async_engine import AsyncEngine
from pdserve.aborts import Owner
from pdserve.rpc.drain import Drain
from pdserve.rpc.owners import owner_of, scope_from_pb
from pdserve.identity import WorkerIdentity
from pdserve.rpc.stats import identity_to_pb, stats_to_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.worker.client_aborts import ClientAborts
from pdserve.worker.live import LiveRequests
from pdserve.worker.prefix_probe import cached_prefix
from pdserve.worker.role import RoleState


class ServedWorker(Protocol):
    """What the common RPCs ask of a role's worker."""

    engine: AsyncEngine
    live: LiveRequests  # the requests it serves: Abort ends one, their count is its load

    def kv_rank_bytes(self) -> list[int]: ...


class CommonWorkerRpcs:
    role: str  # "prefill" | "decode", as its Stats report it

    def __init__(self, worker: ServedWorker, tracer: trace.Tracer, draining: Drain, transport: str):
        """`transport`: the KV transport of this worker's reservations (those it fills, or hands out)."""
        self.worker = worker
        self.tracer = tracer
        self.draining = draining
        self.transport = transport
        self.address = ""  # host:port the fleet reaches this worker at: set at start-up, before it serves
        self.roles: RoleState | None = None  # an elastic worker's role, shared by both roles' servicers
        self.identity: WorkerIdentity | None = None  # what it serves: set at start-up, before it serves
        # Aborts by owner, over this role's requests (an elastic worker's roles share one: serve_roles).
        self.aborts = ClientAborts([worker.live])

    def refuse_if_aborted(self, request: wpb.WorkerRequest) -> Owner | None:
        """The request's owner, unless its client's Abort came first (ClientAborted: ABORTED). Call
        it in the same turn of the event loop as the open that enters the request in its table."""
        owner = owner_of(request)
        self.aborts.refuse_if_aborted(owner)
        return owner

    def refuse_unless_serving(self) -> None:
        """New work of this servicer's role: refused while draining, and on an elastic worker
        unless it serves this role now (UNAVAILABLE: the router places it elsewhere)."""
        self.draining.refuse_if_draining()
        if self.roles is not None:
            self.roles.refuse_unless(self.role)

    def in_flight(self) -> int:
        """Requests this worker still serves (a drain waits for none)."""
        return len(self.worker.live)

    async def MatchPrefix(self, request: wpb.MatchPrefixRequest, context) -> wpb.MatchPrefixResponse:
        return wpb.MatchPrefixResponse(cached_tokens=await cached_prefix(self.worker.engine, request.token_ids))

    async def Abort(self, request: wpb.WorkerAbortRequest, context) -> wpb.WorkerAbortResponse:
        """One attempt by its id (its router's), or every request of an owner (any router's)."""
        owner = owner_of(request)
        if owner is None:
            return wpb.WorkerAbortResponse(found=self.worker.live.abort(request.request_id))
        return wpb.WorkerAbortResponse(found=self.aborts.apply(owner, scope_from_pb(request.scope)))

    async def Stats(self, request: wpb.StatsRequest, context) -> wpb.WorkerStats:
        engine = self.worker.engine
        role = self.roles.role if self.roles is not None else self.role
        stats = stats_to_pb(role, engine.stats, self.draining.draining, engine.rates,
                            await engine.queued_prefill_tokens())
        if self.roles is not None:
            stats.elastic = True
            stats.next_role = self.roles.next_role or ""
        stats.kv_rank_bytes.extend(self.worker.kv_rank_bytes())
        if self.identity is not None:
            stats.identity.CopyFrom(identity_to_pb(self.identity))
        return stats

    @property
    def kv_identity(self) -> str:
        """The identity digest its reservations carry and the ones it fills must carry."""
        return self.identity.kv_digest if self.identity is not None else ""
