"""Where each live request is, and every state transition, in one place.

    add ──> WAITING ──admit──> RUNNING ──finish/abort──> FINISHED
              │  ^               │  │
              │  └──recompute────┘  └──swap──> SWAPPED ──admit (swap in)──> RUNNING
              └──reserve (remote)──> RUNNING, receiving ──received──> RUNNING, decoding

`running` is ordered by (lane, admit_seq): decodes of higher classes are served first.
`prefilling` is kept with it: the running requests lacking KV for more than one token (the rest
are decodes). It changes only here and when a step's results arrive (`progressed`).
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple

from pdserve.kv.manager import KVManager
from pdserve.requests import PreemptionMode, Priority, Request, RequestState
from pdserve.scheduler.ordering import QueueOrder
from pdserve.scheduler.queue import Candidate, Group, RequestQueue


class Admission(NamedTuple):
    rank: int  # its rank when admitted: victim choice reads it while it runs
    waited_s: float  # how long it had waited by then (aging goes on from here if it is preempted)
    at: float  # when: it has run uninterrupted since
    outputs: int  # its output tokens then


class Queues:
    def __init__(self, order: QueueOrder, max_running: int):
        self.order = order
        self.max_running = max_running
        self.requests: dict[str, Request] = {}
        self.waiting = RequestQueue(order, Group.WAITING)
        self.swapped = RequestQueue(order, Group.SWAPPED)
        self.running: list[Request] = []
        self.receiving: dict[str, Request] = {}
        self.remote: set[str] = set()  # waiting requests whose prompt KV comes from a prefill worker
        self.prefilling: dict[str, Request] = {}  # running requests with more than one token to compute
        self.vips: dict[str, Request] = {}  # VIP requests holding device blocks (running, receiving)
        self.vip_epoch = 0  # counts changes to `vips`, so a tally over them can be kept until it moves
        self.running_epoch = 0  # counts requests joining `running` (leaving it never bumps it)
        self._entered: dict[str, float] = {}  # queued: now - entered is how long it has waited, as aging counts
        self._admitted: dict[str, Admission] = {}  # running and receiving requests
        self._arrivals = itertools.count()
        self._admissions = itertools.count()

    def running_rank(self, request: Request) -> int:
        """A running (or receiving) request's rank for victim choice: the one it was admitted at.
        Aging counts waiting only, so a request's claim against preemption does not grow while it runs."""
        return self._admitted[request.request_id].rank

    def admission(self, request: Request) -> Admission:
        """A running (or receiving) request's last admission."""
        return self._admitted[request.request_id]

    def running_prefill(self, request: Request, now: float) -> Candidate:
        """A running prefill's place in the stream of prefill work: ranked as if it still waited,
        so it goes before every queued request that entered after it (it holds blocks they may
        need: stopping it behind them could leave both stuck)."""
        rid = request.request_id
        entered = self._entered[rid]
        return Candidate(self.order.rank(request, now - entered), Group.RUNNING, entered, request.arrival_seq, request)

    def has_slot(self) -> bool:
        return len(self.running) + len(self.receiving) < self.max_running

    def _running_key(self, request: Request) -> tuple[int, int]:
        return self.order.lane(request), request.admit_seq

    def add(self, request: Request, now: float, remote: bool) -> None:
        """New here (maybe handed over from another worker, `request.age_s` old): no KV, never
        admitted. It enters the queue as if it had arrived `age_s` ago; a stream begun elsewhere
        (output tokens already) resumes before new requests of its rank."""
        request.arrival_seq, request.admit_seq = next(self._arrivals), -1
        request.state, request.num_computed_tokens = RequestState.WAITING, 0
        self.requests[request.request_id] = request
        entered = self._entered[request.request_id] = now - request.age_s
        if remote:
            self.remote.add(request.request_id)
        self.waiting.push(request, entered, Group.RESUMING if request.output_token_ids else Group.WAITING)

    def admit(self, request: Request, now: float) -> None:
        """WAITING or SWAPPED -> RUNNING."""
        (self.swapped if request.state == RequestState.SWAPPED else self.waiting).remove(request)
        self._start(request, now)
        self._run(request)

    def reserve(self, request: Request, now: float) -> None:
        """WAITING (remote) -> RUNNING, receiving its KV."""
        self.waiting.remove(request)
        self._start(request, now)
        self.receiving[request.request_id] = request

    def received(self, request: Request) -> None:
        del self.receiving[request.request_id]
        self.remote.discard(request.request_id)
        self._run(request)

    def _run(self, request: Request) -> None:
        bisect.insort(self.running, request, key=self._running_key)
        self.running_epoch += 1
        self.progressed(request)

    def progressed(self, request: Request) -> None:
        """A running request's computed or known tokens changed: is it still prefilling?"""
        if _uncomputed(request) > 1:
            self.prefilling[request.request_id] = request
        else:
            self.prefilling.pop(request.request_id, None)

    def _start(self, request: Request, now: float) -> None:
        request.state = RequestState.RUNNING
        request.admit_seq = next(self._admissions)
        waited = now - self._entered[request.request_id]
        self._admitted[request.request_id] = Admission(self.order.rank(request, waited), waited, now,
                                                       len(request.output_token_ids))
        if request.priority == Priority.VIP:
            self.vips[request.request_id] = request
            self.vip_epoch += 1

    def preempt(self, request: Request, mode: PreemptionMode, now: float, sliced: bool = False) -> None:
        """RUNNING -> WAITING (recompute: KV dropped; it resumes before new requests of its rank)
        or SWAPPED. It waits on from the wait it had when admitted: its rank then, aging from there.
        `sliced` (a time slice's victim, slicing.py): it enters now, as a resuming stream swapped
        or not, behind the streams of its rank already waiting; its wait begins again."""
        self.running.remove(request)
        self._leave(request)
        request.num_preemptions += 1
        waited = 0.0 if sliced else self._admitted[request.request_id].waited_s
        del self._admitted[request.request_id]
        entered = self._entered[request.request_id] = now - waited
        if mode == PreemptionMode.SWAP:
            request.state = RequestState.SWAPPED
            self.swapped.push(request, entered, Group.RESUMING if sliced else None)
        else:
            request.state = RequestState.WAITING
            request.num_computed_tokens = 0
            self.waiting.push(request, entered, Group.RESUMING)

    def remove(self, request: Request) -> None:
        """Any live state -> FINISHED."""
        if request.request_id in self.receiving:
            del self.receiving[request.request_id]
        elif request.state == RequestState.RUNNING:
            self.running.remove(request)
        elif request.state == RequestState.SWAPPED:
            self.swapped.remove(request)
        else:
            self.waiting.remove(request)
        request.state = RequestState.FINISHED
        del self.requests[request.request_id]
        del self._entered[request.request_id]
        self._admitted.pop(request.request_id, None)
        self.remote.discard(request.request_id)
        self._leave(request)

    def _leave(self, request: Request) -> None:
        """It no longer holds device blocks."""
        self.prefilling.pop(request.request_id, None)
        if self.vips.pop(request.request_id, None) is not None:
            self.vip_epoch += 1

    def queued_prefill_tokens(self) -> int:
        """Uncomputed tokens of waiting requests whose KV is computed here, and of running prefills."""
        queued = (r for r in self.waiting if r.request_id not in self.remote)
        return sum(_uncomputed(r) for r in (*queued, *self.prefilling.values()))

    def check_integrity(self, kv: KVManager) -> None:
        running, receiving = set(map(id, self.running)), set(map(id, self.receiving.values()))
        waiting, swapped = set(map(id, self.waiting)), set(map(id, self.swapped))
        assert len(running) == len(self.running) and len(waiting) == len(self.waiting)
        assert len(swapped) == len(self.swapped), "a request is queued twice"
        sets = (running, receiving, waiting, swapped)
        assert sum(map(len, sets)) == len(set().union(*sets)) == len(self.requests), "a request is in two places"
        assert set(self._entered) == set(self.requests), "queue entry times drifted"
        holding = {r.request_id for r in (*self.running, *self.receiving.values())}
        assert set(self._admitted) == holding, "admissions drifted"
        assert len(self.running) + len(self.receiving) <= self.max_running
        keys = [self._running_key(r) for r in self.running]
        assert keys == sorted(keys), "running is out of order"
        holding = [r for r in (*self.running, *self.receiving.values()) if r.priority == Priority.VIP]
        assert set(map(id, holding)) == set(map(id, self.vips.values())), "VIP tally drifted"
        prefilling = {r.request_id: r for r in self.running if _uncomputed(r) > 1}
        assert prefilling == self.prefilling, "prefilling set drifted"
        for request in self.requests.values():
            _check_request(request, kv, request.request_id in self.receiving)


def _check_request(request: Request, kv: KVManager, receiving: bool) -> None:
    rid, computed = request.request_id, request.num_computed_tokens
    assert 0 <= computed <= request.num_tokens
    if request.state == RequestState.RUNNING:
        held = kv.num_blocks(rid)
        assert not kv.host_blocks(rid)
        if receiving:
            assert computed == 0 and held == kv.blocks_for(request.num_remote_tokens)
        else:
            assert kv.blocks_for(computed) <= held <= kv.blocks_for(request.num_tokens), f"{rid} table size"
    elif request.state == RequestState.SWAPPED:
        assert not kv.has_blocks(rid) and kv.num_host_blocks(rid) == kv.blocks_for(computed)
    else:
        assert request.state == RequestState.WAITING and computed == 0, f"{rid} waiting with KV"
        assert not kv.has_blocks(rid) and not kv.host_blocks(rid)


def _uncomputed(request: Request) -> int:
    """Tokens without KV: 1 for a decode (Request.is_prefilling, inlined for the hot loop)."""
    return len(request.prompt_token_ids) + len(request.output_token_ids) - request.num_computed_tokens
