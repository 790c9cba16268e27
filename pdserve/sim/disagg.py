"""Disaggregated xPyD: prefill instances compute prompts, decode instances generate.

Mirrors the service's request path (docs/ARCHITECTURE.md):

    arrive ──> decode instance with the most free KV: add_remote; its next step reserves blocks
           ──> prefill instance (longest cached prefix, then least load): add with max_tokens=1
               every prefill step: each chunk's KV goes out over the instance's link (FIFO)
               last chunk samples the first token (the client's TTFT); blocks stay held
           ──> when the last piece has crossed: release the hold, mark_received on the decode
               instance, which decodes the rest like any running request
"""

from __future__ import annotations

from pdserve.kv.manager import BlockHold
from pdserve.requests import Request, SamplingParams
from pdserve.sim.costmodel import StepCostModel
from pdserve.sim.deployment import Disaggregated, SimConfig, kv_link
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
        self.prefill = [Instance(f"prefill-{i}", Role.PREFILL, cfg, d.prefill_tp, d.policy, loop, self,
                                 check_integrity) for i in range(d.prefill_gpus // d.prefill_tp)]
        self.decode = [Instance(f"decode-{i}", Role.DECODE, cfg, d.decode_tp, d.policy, loop, self,
                                check_integrity) for i in range(d.decode_gpus // d.decode_tp)]
        self.instances = [*self.prefill, *self.decode]
        self._block_size = cfg.block_size
        self._links = {p.name: KVLink(p.model, kv_link(d, cfg)) for p in self.prefill}
        self._unreserved = {i.name: 0 for i in self.decode}  # prompt tokens queued, not yet reserved
        self._prefill_load = {i.name: 0 for i in self.prefill}
        self._decode_of: dict[str, Instance] = {}
        self._sent: dict[str, int] = {}
        self._last_piece: dict[str, float] = {}

    def arrive(self, request: Request) -> None:
        decode = max(self.decode, key=self._decode_room)
        if self._admit(decode.scheduler.add_remote, request):
            self._unreserved[decode.name] += request.num_prompt_tokens
            self._decode_of[request.request_id] = decode
            decode.kick()

    def _decode_room(self, decode: Instance) -> int:
        return decode.scheduler.kv.num_available * self._block_size - self._unreserved[decode.name]

    def step_done(self, instance: Instance, record: StepRecord) -> None:
        self._account(instance, record)
        if instance.role == Role.PREFILL:
            self._prefill_step(instance, record)
        else:
            self._decode_step(instance, record)

    # ---- decode side ----

    def _decode_step(self, decode: Instance, record: StepRecord) -> None:
        self._emit_tokens(record)
        for hold in record.holds.values():
            decode.scheduler.release_hold(hold)
        for reservation in record.reserved:
            self._unreserved[decode.name] -= reservation.request.num_prompt_tokens
            self._dispatch(reservation.request)

    def _dispatch(self, request: Request) -> None:
        """Blocks are reserved on the decode side: start the prefill."""
        prefill = max(self.prefill, key=lambda p: (p.scheduler.kv.probe(request.prompt_token_ids),
                                                    -self._prefill_load[p.name]))
        local = Request(request.request_id, request.prompt_token_ids, SamplingParams(max_tokens=1, ignore_eos=True),
                        request.priority, arrival_time=request.arrival_time)
        if not self._admit(prefill.scheduler.add, local):
            self._abort_decode(request.request_id)
            return
        self._prefill_load[prefill.name] += request.num_prompt_tokens
        self._sent[request.request_id] = 0
        prefill.kick()

    def _abort_decode(self, request_id: str) -> None:
        decode = self._decode_of.pop(request_id)
        decode.scheduler.abort(request_id)
        for hold in decode.scheduler.take_holds().values():
            decode.scheduler.release_hold(hold)
        decode.kick()

    # ---- prefill side ----

    def _prefill_step(self, prefill: Instance, record: StepRecord) -> None:
        link, end, holds = self._links[prefill.name], record.end_s, dict(record.holds)
        for chunk in record.output.chunks:
            rid = chunk.request.request_id
            self._sent[rid] += chunk.num_tokens
            self._last_piece[rid] = link.send(chunk.num_tokens, end)
            if chunk.samples:
                self.recorder.token(rid, end)
        for request in record.finished:
            rid = request.request_id
            rest = request.num_prompt_tokens - self._sent.pop(rid)
            arrived = link.send(rest, end) if rest > 0 else self._last_piece.get(rid, end)
            self._last_piece.pop(rid, None)
            self._prefill_load[prefill.name] -= request.num_prompt_tokens
            hold = holds.pop(rid, None)
            self.loop.at(arrived, lambda p=prefill, r=rid, h=hold: self._deliver(p, r, h))
        for hold in holds.values():
            prefill.scheduler.release_hold(hold)

    def _deliver(self, prefill: Instance, request_id: str, hold: BlockHold | None) -> None:
        if hold is not None:
            prefill.scheduler.release_hold(hold)
            prefill.kick()
        decode = self._decode_of.pop(request_id)
        request = decode.scheduler.mark_received(request_id, FAKE_TOKEN)
        self.recorder.kv_transferred_tokens += request.num_prompt_tokens
        if request.is_finished:
            self.recorder.finish(request_id, self.loop.now)
        decode.kick()
