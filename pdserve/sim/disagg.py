"""Disaggregated xPyD: prefill instances compute prompts, decode instances generate.

Mirrors the service's request path (docs/ARCHITECTURE.md):

    arrive ──> decode instance with the most free KV: add_remote; its next step reserves blocks
           ──> prefill instance (longest cached prefix, then least load): add with max_tokens=1
               every prefill step: each chunk's KV goes out over the instance's link (FIFO)
               last chunk samples the first token (the client's TTFT); blocks stay held
           ──> when the last piece has crossed: release the hold, mark_received on the decode
               instance, which decodes the rest like any running request

With SimConfig.reserve_at "prefill" (the service's router's default, `--reserve-at prefill`) the
prompt goes to its prefill instance at once, and its decode blocks are asked for, on the decode
instance with the most room then, when the prefill instance first schedules it; what it computes
before they are reserved waits there (held), then crosses.

An elastic split (Disaggregated.elastic) also runs the router's planner (elastic.py); an
instance changing role takes no new work of its old role and switches once it holds nothing. A
decode instance leaving moves its running requests with their KV, as the service does
(--on-leave move): detach (a hold on the blocks) -> reservation on the decode instance with the
most room -> the KV of every token but the last over the leaving instance's link -> release the
hold; mark_received there, and the request decodes on. Its queued ones go elsewhere unreserved.
"""

from __future__ import annotations

from collections import Counter

from pdserve.admission import Verdict
from pdserve.elastic import PlannerPolicy, RoleChange
from pdserve.kv.manager import BlockHold
from pdserve.requests import Request, RequestState, SamplingParams
from pdserve.sim.costmodel import StepCostModel
from pdserve.sim.admitting import SimAdmission
from pdserve.sim.deployment import Disaggregated, SimConfig, kv_link
from pdserve.sim.elastic import SimPlanner, fleet_signals
from pdserve.sim.events import EventLoop
from pdserve.sim.flow import Flow
from pdserve.sim.hardware import Link
from pdserve.sim.instance import Instance, Role, StepRecord
from pdserve.sim.recorder import Recorder
from pdserve.sim.workloads import FAKE_TOKEN


class KVLink:
    """A prefill instance's outgoing KV wire (its tp devices' own links): pieces in order."""

    def __init__(self, model: StepCostModel, link: Link):
        self._model, self._link = model, link
        self.free_at = 0.0

    def send(self, tokens: int, now: float) -> float:
        """When the KV of `tokens` tokens, handed over at `now`, has arrived."""
        start = max(now, self.free_at)
        self.free_at = start + self._model.kv_transfer_time(tokens, self._link)
        return self.free_at


class DisaggregatedFlow(Flow):
    def __init__(self, deployment: Disaggregated, cfg: SimConfig, loop: EventLoop, recorder: Recorder,
                 check_integrity: bool = False):
        super().__init__(loop, recorder)
        d = deployment
        hold = False if d.elastic else None  # an elastic instance marks what it sends instead

        def instances(role: Role, gpus: int, tp: int) -> list[Instance]:
            return [Instance(f"{role.value}-{i}", role, cfg, tp, d.policy, loop, self, check_integrity, hold)
                    for i in range(gpus // tp)]

        self.instances = [*instances(Role.PREFILL, d.prefill_gpus, d.prefill_tp),
                          *instances(Role.DECODE, d.decode_gpus, d.decode_tp)]
        self._block_size = cfg.block_size
        self._links = {i.name: KVLink(i.model, kv_link(d, cfg)) for i in self.instances}
        self._unreserved = {i.name: 0 for i in self.instances}  # prompt tokens queued, not yet reserved
        self._prefill_load = {i.name: 0 for i in self.instances}
        self._decode_of: dict[str, Instance] = {}
        self._reserved: set[str] = set()  # requests with decode blocks reserved, KV not yet arrived
        self._sent: dict[str, int] = {}
        self._prefill_of: dict[str, Instance] = {}  # request -> the prefill instance computing its prompt
        self._last_piece: dict[str, float] = {}
        self._delivering: Counter[str] = Counter()  # KV sends under way, by prefill instance
        self._changing: dict[str, Role] = {}  # instance -> the role it is changing to
        self._decoding: dict[str, Instance] = {}  # request -> the decode instance it runs on
        self._moving: dict[str, tuple[Instance, BlockHold]] = {}  # request -> where it left, its KV there
        self._asked_at: dict[str, float] = {}  # request -> when its reservation was asked for
        self._late = cfg.reserve_at == "prefill"
        self._unbound: dict[str, Request] = {}  # late: queued at a prefill instance, no decode instance asked yet
        self._pending: Counter[str] = Counter()  # late: prompt tokens computed, waiting for their reservation
        self._computed: dict[str, tuple[Instance, BlockHold | None, int]] = {}  # late: prefill done, not reserved
        self._admission = (SimAdmission(cfg.admission, cfg.max_chunk_tokens, kv_link(d, cfg))
                           if cfg.admission is not None else None)
        if d.elastic:
            SimPlanner(loop, PlannerPolicy(tbt_objective_s=cfg.tbt_objective_s),
                       lambda: fleet_signals(self.instances, self._changing), self.change_role)

    @property
    def prefill(self) -> list[Instance]:
        """The instances taking prompts now."""
        return self._serving(Role.PREFILL)

    @property
    def decode(self) -> list[Instance]:
        """The instances taking new decodes now."""
        return self._serving(Role.DECODE)

    def _serving(self, role: Role) -> list[Instance]:
        return [i for i in self.instances if i.role == role and i.name not in self._changing]

    def arrive(self, request: Request) -> None:
        """The router's first placement of a request: judged where objectives are set."""
        self._judge(request, 0.0)

    def _judge(self, request: Request, deferred_s: float) -> None:
        decode = self._roomiest_decode()
        if self._admission is None:
            self._place(request, decode)
            return
        judged = self._admission.judge(request, decode, self.prefill, self._decode_room(decode), deferred_s)
        self.recorder.admitted(judged.verdict.value, judged.reason)
        if judged.verdict is Verdict.REFUSE:
            self.recorder.fail(request.request_id, f"refused ({judged.reason}): retry after {judged.retry_after_s:.1f} s")
        elif judged.verdict is Verdict.DEFER:
            later = judged.retry_after_s
            self.loop.at(self.loop.now + later, lambda: self._judge(request, deferred_s + later))
        elif judged.verdict is Verdict.LOCAL:  # the decode instance computes the prompt itself
            if self._admit(decode.scheduler.add, request):
                self._decoding[request.request_id] = decode
                decode.kick()
        else:
            self._place(request, decode)

    def _place(self, request: Request, decode: Instance | None = None) -> None:
        """Ask the decode instance with the most room (or `decode`) to reserve the request's blocks;
        late, queue its prompt on a prefill instance first."""
        if self._late:
            if self._dispatch(request):
                self._unbound[request.request_id] = request
            return
        self._ask(request, decode or self._roomiest_decode())

    def _ask(self, request: Request, decode: Instance) -> bool:
        if not self._admit(decode.scheduler.add_remote, request):
            return False
        self._unreserved[decode.name] += request.num_prompt_tokens
        self._decode_of[request.request_id] = decode
        self._asked_at[request.request_id] = self.loop.now
        decode.kick()
        return True

    def _roomiest_decode(self) -> Instance:
        return max(self.decode, key=self._decode_room)

    def _decode_room(self, decode: Instance) -> int:
        return decode.scheduler.kv.num_available * self._block_size - self._unreserved[decode.name]

    def step_done(self, instance: Instance, record: StepRecord) -> None:
        self._account(instance, record)
        if instance.role == Role.PREFILL:
            self._prefill_step(instance, record)
        else:
            self._decode_step(instance, record)
        self._switch_if_idle(instance)

    # ---- role changes (elastic splits) ----

    def change_role(self, change: RoleChange) -> None:
        """Begin the planner's change: no new work of the old role from now on."""
        instance = next(i for i in self.instances if i.name == change.address)
        self._changing[instance.name] = Role(change.to_role)
        self.recorder.role_change(self.loop.now, f"begun: {change.describe()}")
        if instance.role == Role.DECODE:
            self._place_elsewhere(instance)
        self._switch_if_idle(instance)

    def _place_elsewhere(self, decode: Instance) -> None:
        """Its requests not yet reserved, and those reserved whose prefill has not started, go
        to the decode instances serving (a reservation's KV already on its way lands here)."""
        for rid in [rid for rid, d in self._decode_of.items() if d is decode]:
            if rid in self._reserved and not self._withdraw_prefill(rid):
                continue
            reserved = rid in self._reserved
            self._reserved.discard(rid)
            request = _abort(decode, rid)  # a reservation nothing was written to
            del self._decode_of[rid]
            if not reserved:
                self._unreserved[decode.name] -= request.num_prompt_tokens
            if self._late:  # its prefill runs on: it asks another decode instance
                self._bind(_fresh(request))
            else:
                self._place(_fresh(request))

    def _withdraw_prefill(self, request_id: str) -> bool:
        """Take a reserved request's prompt off its prefill instance if none of it is computed
        or scheduled yet (it waits there); False, and nothing changed, otherwise."""
        prefill = self._prefill_of.get(request_id)
        local = prefill.scheduler.get(request_id) if prefill is not None else None
        if local is None or local.state != RequestState.WAITING or local.num_computed_tokens or self._sent[request_id]:
            return False
        _abort(prefill, request_id)
        del self._prefill_of[request_id], self._sent[request_id]
        self._prefill_load[prefill.name] -= local.num_prompt_tokens
        return True

    def _switch_if_idle(self, instance: Instance) -> None:
        role = self._changing.get(instance.name)
        if role is None or instance.busy:
            return
        if instance.role == Role.DECODE:
            self._move_decodes(instance)
        if self._holds_work(instance):
            return
        del self._changing[instance.name]
        instance.role, instance.last_step_s = role, 0.0  # its old role's steps say nothing of the new one
        self.recorder.role_change(self.loop.now, f"done: {instance.name} serves as {role.value}")

    def _holds_work(self, instance: Instance) -> bool:
        stats = instance.scheduler.stats()
        return bool(stats.running or stats.waiting or stats.swapped or stats.receiving
                    or self._delivering[instance.name] or any(d is instance for d in self._decode_of.values())
                    or any(source is instance for source, _ in self._moving.values()))

    def _move_decodes(self, source: Instance) -> None:
        """Between two of its steps: every request decoding there whose KV is all on the device
        leaves with it (the others, preempted or swapped, finish there)."""
        for rid in [rid for rid, d in self._decoding.items() if d is source]:
            request = source.scheduler.get(rid)
            hold = source.scheduler.detach(rid)
            if hold is None:
                continue
            del self._decoding[rid]
            moved = _fresh(request)
            moved.output_token_ids = list(request.output_token_ids)
            target = self._roomiest_decode()
            if not self._admit(lambda r: target.scheduler.add_remote(r, r.num_tokens - 1), moved):
                source.scheduler.release_hold(hold)
                continue
            self._unreserved[target.name] += moved.num_prompt_tokens
            self._decode_of[rid] = target
            self._moving[rid] = (source, hold)
            target.kick()

    def _moved_reserved(self, request: Request) -> None:
        """A moving request's blocks are reserved: its KV crosses from where it left."""
        source, _ = self._moving[request.request_id]
        arrived = self._links[source.name].send(request.num_tokens - 1, self.loop.now)
        self.loop.at(arrived, lambda rid=request.request_id: self._moved_landed(rid))

    def _moved_landed(self, request_id: str) -> None:
        source, hold = self._moving.pop(request_id)
        source.scheduler.release_hold(hold)
        self._land(request_id, None)
        self._switch_if_idle(source)

    def _land(self, request_id: str, first_token: int | None) -> None:
        """The KV of a reserved request has crossed: it decodes on (or ends at once)."""
        self._reserved.discard(request_id)
        decode = self._decode_of.pop(request_id)
        request = decode.scheduler.mark_received(request_id, first_token)
        self.recorder.kv_transferred_tokens += request.num_remote_tokens
        self._decoding[request_id] = decode
        if request.is_finished:
            self._decoding.pop(request_id)
            self.recorder.finish(request_id, self.loop.now)
        decode.kick()
        self._switch_if_idle(decode)

    # ---- decode side ----

    def _decode_step(self, decode: Instance, record: StepRecord) -> None:
        self._emit_tokens(record)
        for hold in record.holds.values():
            decode.scheduler.release_hold(hold)
        for request in record.finished:
            self._decoding.pop(request.request_id, None)
        for reservation in record.reserved:
            self._unreserved[decode.name] -= reservation.request.num_prompt_tokens
            self._reserved.add(reservation.request.request_id)
            asked = self._asked_at.pop(reservation.request.request_id, None)
            if self._admission is not None and asked is not None:
                self._admission.waits.add(self.loop.now - asked)
            if reservation.request.request_id in self._moving:
                self._moved_reserved(reservation.request)
            elif self._late:
                self._reserved_late(reservation.request.request_id)
            elif not self._dispatch(reservation.request):
                self._abort_decode(reservation.request.request_id)

    def _dispatch(self, request: Request) -> bool:
        """Start the prefill (blocks are reserved on the decode side, unless late); False: refused."""
        prefill = max(self.prefill, key=lambda p: (p.scheduler.kv.probe(request.prompt_token_ids),
                                                    -self._prefill_load[p.name]))
        local = Request(request.request_id, request.prompt_token_ids, SamplingParams(max_tokens=1, ignore_eos=True),
                        request.priority, arrival_time=request.arrival_time)
        local.sends_kv = True
        if not self._admit(prefill.scheduler.add, local):
            return False
        self._prefill_load[prefill.name] += request.num_prompt_tokens
        self._sent[request.request_id] = 0
        self._prefill_of[request.request_id] = prefill
        prefill.kick()
        return True

    def _bind(self, request: Request) -> bool:
        """Late: the prefill of `request` has begun; ask the decode instance with the most room now
        to reserve its blocks. False: refused there; the request failed, and its prefill ended."""
        if self._ask(request, self._roomiest_decode()):
            return True
        self._abort_prefill(request)
        return False

    def _reserved_late(self, request_id: str) -> None:
        """Late: the blocks are reserved; what the prefill computed so far crosses now."""
        pending = self._pending.pop(request_id, 0)
        computed = self._computed.pop(request_id, None)
        if computed is None:
            prefill = self._prefill_of[request_id]
            if pending:
                self._last_piece[request_id] = self._links[prefill.name].send(pending, self.loop.now)
            return
        prefill, hold, rest = computed
        arrived = self._links[prefill.name].send(pending + rest, self.loop.now)
        self.loop.at(arrived, lambda: self._deliver(prefill, request_id, hold))

    def _abort_prefill(self, request: Request) -> None:
        """Late: a prefill whose decode instance refused the request ends (in its first chunk's step,
        or, asking again for a decode instance leaving, later: computed, its KV held)."""
        rid = request.request_id
        self._pending.pop(rid, None)
        if rid in self._computed:
            prefill, hold, _ = self._computed.pop(rid)
            self._delivering[prefill.name] -= 1
            if hold is not None:
                prefill.scheduler.release_hold(hold)
            prefill.kick()
            return
        prefill = self._prefill_of.pop(rid)
        _abort(prefill, rid)
        self._prefill_load[prefill.name] -= request.num_prompt_tokens
        del self._sent[rid]
        prefill.kick()

    def _abort_decode(self, request_id: str) -> None:
        self._reserved.discard(request_id)
        decode = self._decode_of.pop(request_id)
        _abort(decode, request_id)
        decode.kick()

    # ---- prefill side ----

    def _prefill_step(self, prefill: Instance, record: StepRecord) -> None:
        link, end, holds = self._links[prefill.name], record.end_s, dict(record.holds)
        for chunk in record.output.chunks:
            rid = chunk.request.request_id
            self._sent[rid] += chunk.num_tokens
            if rid in self._unbound and not self._bind(self._unbound.pop(rid)):
                continue
            if self._late and rid not in self._reserved:
                self._pending[rid] += chunk.num_tokens  # no blocks to land in yet
            else:
                self._last_piece[rid] = link.send(chunk.num_tokens, end)
            if chunk.samples:
                self.recorder.token(rid, end)
        for request in record.finished:
            rid = request.request_id
            if rid not in self._sent:  # ended here: its decode instance refused it
                continue
            rest = request.num_prompt_tokens - self._sent.pop(rid)
            self._prefill_of.pop(rid, None)
            self._prefill_load[prefill.name] -= request.num_prompt_tokens
            hold = holds.pop(rid, None)
            self._delivering[prefill.name] += 1
            if self._late and rid not in self._reserved:  # the KV waits, held, for its reservation
                self._computed[rid] = (prefill, hold, max(rest, 0))
                continue
            arrived = link.send(rest, end) if rest > 0 else self._last_piece.get(rid, end)
            self._last_piece.pop(rid, None)
            self.loop.at(arrived, lambda p=prefill, r=rid, h=hold: self._deliver(p, r, h))
        for hold in holds.values():
            prefill.scheduler.release_hold(hold)

    def _deliver(self, prefill: Instance, request_id: str, hold: BlockHold | None) -> None:
        if hold is not None:
            prefill.scheduler.release_hold(hold)
            prefill.kick()
        self._delivering[prefill.name] -= 1
        self._land(request_id, FAKE_TOKEN)
        self._switch_if_idle(prefill)


def _abort(instance: Instance, request_id: str) -> Request | None:
    """End a request on an instance and give back at once the blocks its scheduler holds for it
    (nothing will write or read them: no transfer of it is under way)."""
    request = instance.scheduler.abort(request_id)
    for hold in instance.scheduler.take_holds().values():
        instance.scheduler.release_hold(hold)
    return request


def _fresh(request: Request) -> Request:
    """The same request as the router would send it again: its prompt, sampling and class."""
    return Request(request.request_id, request.prompt_token_ids, request.sampling, request.priority,
                   arrival_time=request.arrival_time)
