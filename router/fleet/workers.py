"""The router's view of its workers: addresses, load, and whether each is usable now.

A health watch polls every worker's Stats; each worker has a circuit breaker fed by the polls
and by the faults the request flow charges to it (`charge`). A worker is usable when its last
poll answered, it is not draining, its breaker allows it, and it serves the router's model (its
identity's weights, architecture and tokenizer: a worker serving another is marked incompatible,
said once in an error log line naming what differs, and never gets work). A prefill and a decode
worker are paired only when their identities agree (`pairs_with`: the KV's dtype and block size
and the protocol too). `wait_usable` lets a new request
wait, within its deadline, for a worker of a role instead of failing at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pdserve.identity import ModelFingerprint, WorkerIdentity
from router.fleet.breaker import BreakerConfig, BreakerState, CircuitBreaker
from router.fleet.clients import WorkerClients, WorkerFault, WorkerSnapshot
from router.fleet.links import Links

log = logging.getLogger(__name__)


@dataclass
class Worker:
    address: str
    role: str  # "prefill" | "decode": as listed, then as its Stats say (an elastic worker changes it)
    ready: bool = False  # the last health poll answered
    draining: bool = False
    free_blocks: int = 0
    total_blocks: int = 0
    active_blocks: int = 0
    running: int = 0
    waiting: int = 0
    assigned: int = 0  # requests this router has in flight on it (fresher than polled stats)
    claimed: int = 0  # requests that chose it as their decode worker and have not opened their call yet
    queued_prefill_tokens: int = 0  # prompt tokens it still computes, by its last poll
    sent_tokens: int = 0  # prompt tokens this router sent it to compute since its last poll
    prefill_tokens_per_s: float = 0.0  # its measured prefill speed (0: unknown)
    step_s: float = 0.0  # its recent steps' seconds (0: none yet)
    target_follows: bool = False  # (prefill) it takes a prefill whose reservation follows
    awaiting_target: int = 0  # (prefill) started prompts whose KV waits there for their reservation
    next_role: str = ""  # an elastic worker changing role: usable for neither until it has
    elastic: bool = False  # its role can change
    gave_back: bool = False  # it gave a request back (leaving its role): unused until its next poll
    source: str = "static"  # static | registry | dns:NAME
    silent_polls: int = 0  # consecutive polls without an answer
    # Bumped when a poll answers after one did not: the worker restarted (or its stall ended).
    # A request that failed on an earlier incarnation may be placed on this one.
    incarnation: int = 0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    identity: WorkerIdentity | None = None  # what it serves, by its last poll
    incompatible: tuple[str, ...] = ()  # what differs from the router's model: never used while any

    def usable(self, now: float) -> bool:
        return self.ready and not self.draining and not self.next_role and not self.gave_back \
            and not self.incompatible and self.breaker.allows(now)

    def pairs_with(self, other: "Worker") -> bool:
        """Whether KV computed by one can be read by the other (identities agree; neither known:
        a pool without identities, as in tests of the protocol)."""
        if self.identity is None or other.identity is None:
            return self.identity is other.identity
        return not self.identity.differences(other.identity)

    def take(self, snapshot: WorkerSnapshot) -> None:
        if snapshot.role and snapshot.role != self.role:
            log.warning("worker %s now serves the %s role (was %s)", self.address, snapshot.role, self.role)
            self.role = snapshot.role
        self.next_role, self.elastic, self.gave_back = snapshot.next_role, snapshot.elastic, False
        self.ready, self.draining, self.silent_polls = True, snapshot.draining, 0
        self.free_blocks, self.total_blocks = snapshot.free_blocks, snapshot.total_blocks
        self.running, self.waiting, self.active_blocks = snapshot.running, snapshot.waiting, snapshot.active_blocks
        self.queued_prefill_tokens, self.sent_tokens = snapshot.queued_prefill_tokens, 0
        self.prefill_tokens_per_s, self.step_s = snapshot.prefill_tokens_per_s, snapshot.step_s
        self.identity = snapshot.identity
        self.target_follows, self.awaiting_target = snapshot.target_follows, snapshot.awaiting_target


@dataclass(frozen=True)
class PoolConfig:
    poll_s: float = 0.5
    poll_timeout_s: float = 1.5
    forget_after: int = 6  # silent polls before a registered worker is dropped
    breaker: BreakerConfig = BreakerConfig()


class WorkerPool:
    def __init__(self, clients: WorkerClients, prefill: list[str], decode: list[str],
                 config: PoolConfig = PoolConfig(), on_change: Callable[[], None] = lambda: None,
                 model: ModelFingerprint | None = None,
                 on_incompatible: Callable[[Worker], None] = lambda worker: None):
        """`model`: the router's model, which every worker must serve (None: identities are not
        checked); `on_incompatible(worker)` runs when a worker is found serving another."""
        self.clients = clients
        self.config = config
        self.model = model
        self.on_incompatible = on_incompatible
        self.quarantined: set[tuple[str, str]] = set()  # (prefill, decode) pairs a canary found wrong
        self.links = Links()  # (prefill, decode) pairs whose KV did not get through, for a while
        self.workers: dict[str, Worker] = {}
        self.on_change = on_change
        self._task: asyncio.Task | None = None
        for address in prefill:
            self.add(address, "prefill")
        for address in decode:
            self.add(address, "decode")

    def of_role(self, role: str, partner: Worker | None = None) -> list[Worker]:
        """The usable workers of `role` (that pair with `partner`, when given, in a pair no canary
        found wrong)."""
        now = time.monotonic()
        return [w for w in self.workers.values()
                if w.role == role and w.usable(now) and (partner is None or self.pair_ok(w, partner))]

    def pair_ok(self, a: Worker, b: Worker) -> bool:
        """Their identities agree, no canary found the pair wrong and its KV link is in rotation
        (whichever role each has)."""
        prefill, decode = (a, b) if a.role == "prefill" else (b, a)
        return self._pairs(a, b) and self.links.allows(prefill.address, decode.address, time.monotonic())

    def _pairs(self, a: Worker, b: Worker) -> bool:
        return a.pairs_with(b) and (a.address, b.address) not in self.quarantined \
            and (b.address, a.address) not in self.quarantined

    def cut_off(self, decode: Worker) -> bool:
        """Usable prefill workers would pair with `decode`, but every such pair's KV link is out:
        it prefills for itself meanwhile."""
        now = time.monotonic()
        pairing = [p for p in self.of_role("prefill") if self._pairs(p, decode)]
        return bool(pairing) and not any(self.links.allows(p.address, decode.address, now) for p in pairing)

    def link_failed(self, prefill: str, decode: str, why: str) -> None:
        if self.links.failed(prefill, decode, time.monotonic(), why):
            self.on_change()

    def link_delivered(self, prefill: str, decode: str) -> None:
        if self.links.delivered(prefill, decode):
            self.on_change()

    def quarantine_pair(self, prefill: str, decode: str, wrong: bool) -> None:
        """A canary found the pair wrong (it gets no work) or right again."""
        (self.quarantined.add if wrong else self.quarantined.discard)((prefill, decode))
        self.on_change()

    @property
    def ready(self) -> bool:
        """A usable prefill worker pairs with a usable decode worker."""
        decode = self.of_role("decode")
        return any(self.pair_ok(p, d) for p in self.of_role("prefill") for d in decode)

    def paired(self, workers: list[Worker]) -> list[Worker]:
        """The decode workers among `workers` that some usable prefill worker pairs with (all of
        them while no prefill worker is usable, and those whose every KV link is out: they
        prefill themselves)."""
        prefill = self.of_role("prefill")
        if not prefill:
            return workers
        return [d for d in workers if any(self.pair_ok(p, d) for p in prefill) or self.cut_off(d)]

    async def wait_usable(self, role: str, until: float, partner: Worker | None = None,
                          paired: bool = False) -> list[Worker]:
        """The usable workers of `role` (pairing with `partner`; `paired`: decode workers some
        prefill worker pairs with), waiting for one until `until` (monotonic); [] if none came."""
        def usable() -> list[Worker]:
            workers = self.of_role(role, partner)
            return self.paired(workers) if paired else workers

        while not (workers := usable()) and time.monotonic() < until:
            await asyncio.sleep(min(0.05, max(0.0, until - time.monotonic())))
        return workers

    # ---- membership ----

    def add(self, address: str, role: str, source: str = "static") -> None:
        if address not in self.workers:
            log.info("worker %s (%s) joined via %s", address, role, source)
            self.workers[address] = Worker(address, role, source=source,
                                           breaker=CircuitBreaker(self.config.breaker))

    def remove(self, address: str) -> None:
        """Stop routing to a worker; requests already on it keep their connection until they end."""
        if self.workers.pop(address, None) is not None:
            log.info("worker %s left", address)
            asyncio.ensure_future(self.clients.forget(address))
            self.on_change()

    def sync(self, role: str, addresses: set[str], source: str) -> None:
        """Make the workers of one discovery source exactly `addresses`."""
        for address in addresses:
            self.add(address, role, source)
        for worker in [w for w in self.workers.values() if w.source == source and w.address not in addresses]:
            self.remove(worker.address)

    # ---- health ----

    def incarnation(self, address: str) -> int:
        worker = self.workers.get(address)
        return worker.incarnation if worker is not None else 0

    def leaving(self, address: str) -> bool:
        """By its last poll, the worker is draining or changing role: its requests may depart."""
        worker = self.workers.get(address)
        return worker is not None and (worker.draining or worker.next_role not in ("", worker.role))

    def charge(self, address: str) -> None:
        """A request found this worker gone."""
        worker = self.workers.get(address)
        if worker is not None and worker.breaker.on_failure(time.monotonic()):
            log.warning("worker %s out of rotation for %.1f s (breaker open)", address, worker.breaker.cooldown_s)
            self.on_change()

    def gave_back(self, address: str) -> None:
        """It gave a request back because it leaves its role: place nothing there until a poll
        says what it serves."""
        worker = self.workers.get(address)
        if worker is not None:
            worker.gave_back = True

    def credit(self, address: str) -> None:
        """A request ended well on this worker."""
        worker = self.workers.get(address)
        if worker is not None:
            self._close_breaker(worker)

    def placed(self, worker: Worker, tokens: int = 0) -> None:
        """A request goes to `worker`, `tokens` of its prompt to compute there."""
        worker.assigned += 1
        worker.sent_tokens += tokens
        worker.breaker.on_trial()

    @staticmethod
    def left(worker: Worker) -> None:
        """A request `placed` there is over."""
        worker.assigned -= 1

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._poll_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def refresh(self) -> None:
        await asyncio.gather(*(self._poll(w) for w in list(self.workers.values())))
        self.on_change()

    async def _poll_forever(self) -> None:
        """Each worker is polled on its own: one that does not answer delays nobody else's poll."""
        polls: dict[str, asyncio.Task] = {}
        while True:
            for address, worker in list(self.workers.items()):
                if address not in polls or polls[address].done():
                    polls[address] = asyncio.ensure_future(self._poll_and_tell(worker))
            await asyncio.sleep(self.config.poll_s)

    async def _poll_and_tell(self, worker: Worker) -> None:
        try:
            await self._poll(worker)
            self.on_change()
        except Exception:  # a poll must never end the loop
            log.exception("polling %s failed", worker.address)

    async def _poll(self, worker: Worker) -> None:
        try:
            snapshot = await self.clients.stats(worker.address, worker.role, self.config.poll_timeout_s)
        except WorkerFault:
            self._silent(worker)
            return
        if worker.silent_polls:
            worker.incarnation += 1
        worker.take(snapshot)
        self._judge(worker)
        self._close_breaker(worker)

    def introduce(self, address: str, identity: WorkerIdentity) -> None:
        """What a registering worker says it serves, judged before its first poll (which says it again)."""
        worker = self.workers.get(address)
        if worker is not None and worker.identity is None:
            worker.identity = identity
            self._judge(worker)

    def _judge(self, worker: Worker) -> None:
        """Whether it serves the router's model: said when that changes."""
        if self.model is None:
            return
        differ = ("identity",) if worker.identity is None else worker.identity.model.differences(self.model)
        if differ == worker.incompatible:
            return
        worker.incompatible = differ
        if differ:
            log.error("worker %s (%s) serves another model than this router's (differing: %s): it gets no work "
                      "until it serves this one", worker.address, worker.role, ", ".join(differ))
            self.on_incompatible(worker)
        else:
            log.warning("worker %s (%s) serves this router's model again", worker.address, worker.role)
        self.on_change()

    def _silent(self, worker: Worker) -> None:
        worker.silent_polls += 1
        worker.breaker.on_failure(time.monotonic())
        if worker.breaker.state != BreakerState.CLOSED:
            worker.ready = False
        if worker.source == "registry" and worker.silent_polls >= self.config.forget_after:
            self.remove(worker.address)

    def _close_breaker(self, worker: Worker) -> None:
        reopened = worker.breaker.state != BreakerState.CLOSED
        worker.breaker.on_success()
        if reopened:
            log.info("worker %s back in rotation", worker.address)
            self.on_change()
