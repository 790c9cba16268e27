"""How a request leaves its decode worker (router/flow/decoding.py relays its tokens and asks here at each):
whether it should (its worker leaves, draining or changing role; or rebalancing,
router/placement/rebalancing.py), the Depart call to that worker, and the KV move from it into the next
decode worker's reservation. The policy for a leaving worker is `FlowConfig.on_leave`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from router.fleet.clients import Culprit, FaultKind, MovedKV, Reservation, WorkerClients, WorkerFault
from router.fleet.workers import WorkerPool
from router.flow.flow_types import Attempt, Blame, FlowConfig, OnLeave
from router.placement.observed import Observed
from router.placement.placing import Placer
from router.placement.rebalancing import Rebalancer

log = logging.getLogger(__name__)


@dataclass
class Leaving:
    """One attempt's view of its decode worker letting it go: when it last asked, and where to."""

    asked_at: float = -1e9
    target: str | None = None  # set once the worker let the request depart
    kept_kv: bool = False
    ask_every_s: float = 1.0

    def may_ask(self) -> bool:
        now = time.monotonic()
        if now - self.asked_at < self.ask_every_s:
            return False
        self.asked_at = now
        return True


class LeftFor(Exception):
    """The request left its decode worker for `target` (None: to be placed anew); `kept_kv`: its
    KV waits there for the move."""

    def __init__(self, target: str | None, kept_kv: bool):
        super().__init__(f"departed for {target}")
        self.target, self.kept_kv = target, kept_kv


class Departer:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, placer: Placer, config: FlowConfig,
                 observed: Observed, blame: Blame):
        self.pool = pool
        self.clients = clients
        self.placer = placer
        self.config = config
        self.observed = observed
        self.blame = blame
        self.rebalancer = Rebalancer(config.rebalance_interval_s)

    def wants(self, attempt: Attempt, leaving: Leaving) -> bool:
        """Whether to ask now: not yet let go, not pinned to its pair (a canary), its worker leaves
        (said on its feed, or by its last poll) or is under memory pressure while another has
        room, and not asked within the last second."""
        if leaving.target is not None or attempt.job.pinned:
            return False
        decode = attempt.decode
        if attempt.call.leaving or self.pool.leaving(decode.address):
            return leaving.may_ask()
        if self.config.on_leave is OnLeave.MOVE_KV and self.rebalancer.due(decode, attempt.state.protocol.departures) \
                and leaving.may_ask():
            # the worker's one departure of the interval, claimed now, before the Depart is answered:
            # every request there sees the same pressure at once, and all leaving would overfill the
            # worker they would all choose by its last poll
            self.rebalancer.departed(decode)
            return True
        return False

    async def ask(self, attempt: Attempt, leaving: Leaving) -> None:
        """Ask the decode worker to let the request go, if another one could take it now (else it
        goes on there). A worker that does not answer is left to the stream's fault."""
        job, state, decode = attempt.job, attempt.state, attempt.decode
        policy = self.config.on_leave
        if policy is OnLeave.FINISH:
            return
        target = self.placer.roomier_decode(job, state, decode, self.observed.block_size(decode.address))
        if target is None:
            return
        keep = self.config.kv_timeout_s if policy is OnLeave.MOVE_KV else None
        try:
            answer = await self.clients.decode(decode.address).depart(attempt.worker_id, keep,
                                                                       self.config.probe_timeout_s, state.attachment)
        except WorkerFault as fault:
            log.info("request %s: Depart on %s failed: %s", job.request_id, decode.address, fault)
            return
        if answer.departed:  # (a departure for pressure claimed its interval already: `wants`)
            leaving.target, leaving.kept_kv = target.address, answer.kv_kept
        else:
            log.debug("request %s stays on %s for now: %s", job.request_id, decode.address, answer.reason)

    async def move_kv(self, attempt: Attempt, departed: tuple[str, str], reservation: Reservation) -> MovedKV:
        """The departed worker sends the request's KV into the attempt's reservation. A failure of
        the move is the departed worker's (GONE: charged), the new worker's (seen through the
        move: its own fault), or nobody's (its KV was given back): a WorkerFault either way."""
        source, source_id = departed
        try:
            return await attempt.call.unless_failed(self.clients.decode(source).move_kv(source_id, reservation,
                                                                                        self.config.kv_timeout_s))
        except WorkerFault as fault:
            if fault.address != source:
                raise
            if fault.culprit == Culprit.PEER:  # the new worker failed, seen through the move
                raise WorkerFault(FaultKind.GONE, attempt.decode.address, fault.message) from None
            self.blame(attempt.state, fault, "decode", source)
            if fault.kind in (FaultKind.GONE, FaultKind.CORRUPT):
                raise
            raise WorkerFault(FaultKind.WITHDRAWN, source, f"the KV move from {source} failed: {fault.message}",
                              Culprit.NOBODY) from None
