"""The request protocol between router and workers, as one state machine (no transport here).

                    placed(local)                            first token
          ┌──────────────────────────────► LOCAL_PREFILL ───────────────┐
          │                                                             ▼
    ──► PLACING ──placed──► RESERVING ──reserved──► PREFILLING ──chunk──► KV_IN_FLIGHT ──first token──► DECODING
          ▲                    │                        │ first token ▲        (chunk: stays)              │ tokens: stays
          │                    │ move_kv                └─────────────┘                                    │ finished
          │                    └──────► MOVING_KV ──kv_moved──────────────────────────────────────────► DECODING
          │  retry (no token out yet) / resume (tokens out: prompt + tokens so far prefilled again,         ▼
          └── by the prefill pool) ◄── fault in any live phase ──► FAILED                           FINISHED
          └── move (RESERVING: queued for blocks while another decode worker has room; not a fault)
          └── depart (DECODING: its decode worker leaves; the request's KV moves to the next one, MOVING_KV)
          └── attach ──► ATTACHING ──tokens──► DECODING  (a continued stream: the decode worker that held
                                                         its request drives it from this router on)
          └── placed_late ──► STARTING ──chunk──► HELD ──reserved──► KV_IN_FLIGHT  (reserved when the prefill
                              (move: to a sooner      (move: queued for blocks,    starts: the prompt is queued
                               prefill worker)         back to PLACING)            and begun on P before D reserves)
                                                       complete (every token was out) ──► FINISHED
                                                       the client went away ──► CANCELLED

`RequestProtocol` holds one request's phase and history and refuses any transition not in
`TRANSITIONS`; `router/flow/flow.py` and its phases drive it, `router/flow/recovery.py` decides what a fault
leads to.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class Phase(enum.Enum):
    PLACING = "placing"  # choosing a decode worker (waits for one, within the deadline)
    RESERVING = "reserving"  # Decode call open, waiting for its KV reservation
    PREFILLING = "prefilling"  # Prefill call open, no chunk computed yet
    KV_IN_FLIGHT = "kv_in_flight"  # chunks computed, KV pieces streaming, until the first token
    LOCAL_PREFILL = "local_prefill"  # the decode worker prefills itself (colocated, cached, or a resume with no prefill worker)
    MOVING_KV = "moving_kv"  # the decode worker it departed from sends its KV into the new one's reservation
    STARTING = "starting"  # Prefill call open without a reservation, queued there: nothing computed yet
    HELD = "held"  # the prefill started: its KV waits on the prefill worker while the decode worker reserves
    ATTACHING = "attaching"  # a stream continued: attached to the decode worker that held it (pdserve/reattach.py)
    DECODING = "decoding"  # tokens from the decode worker
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (Phase.FINISHED, Phase.FAILED, Phase.CANCELLED)


class Signal(enum.Enum):
    PLACED = "placed"  # a decode worker took the request; its KV comes from a prefill worker
    PLACED_LOCAL = "placed_local"  # ... and prefills it itself
    PLACED_LATE = "placed_late"  # ... and reserves its blocks once a prefill worker has started the prompt
    RESERVED = "reserved"  # the decode worker reserved blocks; a prefill worker was chosen
    CHUNK = "chunk"  # the prefill worker computed a chunk
    FIRST_TOKEN = "first_token"
    TOKENS = "tokens"
    FINISHED = "finished"
    RETRY = "retry"  # a fault before any token reached the client: start over elsewhere
    MOVE = "move"  # still queued for blocks on its decode worker while another could reserve them now
    DEPART = "depart"  # its decode worker leaves (draining, changing role): it continues on another one
    MOVE_KV = "move_kv"  # the new decode worker reserved blocks: the departed one sends the KV there
    KV_MOVED = "kv_moved"  # the KV is in: decoding goes on
    RESUME = "resume"  # a fault after tokens reached the client: continue elsewhere
    ATTACH = "attach"  # a stream continued at this router: the decode worker holding its request drives it here now
    COMPLETE = "complete"  # a fault after the last token: nothing is missing
    FAIL = "fail"
    CANCEL = "cancel"


LIVE = (Phase.PLACING, Phase.RESERVING, Phase.PREFILLING, Phase.KV_IN_FLIGHT, Phase.LOCAL_PREFILL, Phase.MOVING_KV,
        Phase.ATTACHING, Phase.DECODING, Phase.STARTING, Phase.HELD)

TRANSITIONS: dict[tuple[Phase, Signal], Phase] = {
    (Phase.PLACING, Signal.PLACED): Phase.RESERVING,
    (Phase.PLACING, Signal.PLACED_LOCAL): Phase.LOCAL_PREFILL,
    (Phase.PLACING, Signal.PLACED_LATE): Phase.STARTING,
    (Phase.STARTING, Signal.MOVE): Phase.STARTING,  # to another prefill worker (nothing reserved yet)
    (Phase.STARTING, Signal.CHUNK): Phase.HELD,
    (Phase.HELD, Signal.RESERVED): Phase.KV_IN_FLIGHT,
    (Phase.HELD, Signal.MOVE): Phase.PLACING,  # queued for blocks while another decode worker has room
    (Phase.RESERVING, Signal.RESERVED): Phase.PREFILLING,
    (Phase.RESERVING, Signal.MOVE): Phase.PLACING,
    (Phase.RESERVING, Signal.MOVE_KV): Phase.MOVING_KV,
    (Phase.MOVING_KV, Signal.KV_MOVED): Phase.DECODING,
    (Phase.DECODING, Signal.DEPART): Phase.PLACING,
    (Phase.PLACING, Signal.ATTACH): Phase.ATTACHING,
    (Phase.ATTACHING, Signal.TOKENS): Phase.DECODING,
    (Phase.ATTACHING, Signal.FINISHED): Phase.FINISHED,
    (Phase.ATTACHING, Signal.DEPART): Phase.PLACING,
    (Phase.PREFILLING, Signal.MOVE): Phase.PREFILLING,  # to another prefill worker, into the same reservation
    (Phase.PREFILLING, Signal.CHUNK): Phase.KV_IN_FLIGHT,
    (Phase.PREFILLING, Signal.FIRST_TOKEN): Phase.DECODING,
    (Phase.KV_IN_FLIGHT, Signal.CHUNK): Phase.KV_IN_FLIGHT,
    (Phase.KV_IN_FLIGHT, Signal.FIRST_TOKEN): Phase.DECODING,
    (Phase.LOCAL_PREFILL, Signal.TOKENS): Phase.DECODING,
    (Phase.DECODING, Signal.TOKENS): Phase.DECODING,
    (Phase.LOCAL_PREFILL, Signal.FINISHED): Phase.FINISHED,
    (Phase.DECODING, Signal.FINISHED): Phase.FINISHED,
    **{(p, Signal.RETRY): Phase.PLACING for p in LIVE if p not in (Phase.DECODING,)},
    **{(p, Signal.RESUME): Phase.PLACING for p in LIVE},  # a fault again while a resume is placed or prefilled
    # (PLACING: a continued stream whose client has every token already)
    **{(p, Signal.COMPLETE): Phase.FINISHED for p in (Phase.PLACING, Phase.LOCAL_PREFILL, Phase.ATTACHING,
                                                     Phase.DECODING)},
    **{(p, Signal.FAIL): Phase.FAILED for p in LIVE},
    **{(p, Signal.CANCEL): Phase.CANCELLED for p in LIVE},
}


class ProtocolError(RuntimeError):
    """A transition the protocol does not have: a bug in the driver, never a worker's fault."""


@dataclass(frozen=True)
class Step:
    phase: Phase
    signal: Signal
    at: float
    note: str = ""


@dataclass
class RequestProtocol:
    """One request's place in the protocol. A resume re-enters PLACING with tokens already out."""

    request_id: str
    phase: Phase = Phase.PLACING
    # Every step but the repeats of one: a run of TOKENS while decoding is its first step (a
    # stream's history stays as long as its transitions, not its tokens); `counts` has them all.
    history: list[Step] = field(default_factory=list)
    counts: dict[Signal, int] = field(default_factory=dict)

    def advance(self, signal: Signal, note: str = "") -> Phase:
        """O(1) per call: it runs on every relayed token."""
        phase = self.phase
        nxt = TRANSITIONS.get((phase, signal))
        if nxt is None:
            raise ProtocolError(f"request {self.request_id}: no transition from {phase.value} on {signal.value}")
        self.counts[signal] = self.counts.get(signal, 0) + 1
        last = self.history[-1] if self.history else None
        if last is None or nxt is not phase or last.signal is not signal or last.phase is not phase:
            self.history.append(Step(phase, signal, time.monotonic(), note))
        self.phase = nxt
        return nxt

    @property
    def attempts(self) -> int:
        """Placements so far (each attempt starts with one)."""
        return sum(self.counts.get(s, 0) for s in (Signal.PLACED, Signal.PLACED_LOCAL, Signal.PLACED_LATE,
                                                   Signal.ATTACH))

    @property
    def moves(self) -> int:
        """Attempts that ended by a move out of a queue, not a fault."""
        return self.counts.get(Signal.MOVE, 0)

    @property
    def departures(self) -> int:
        """Attempts that ended because their decode worker left (not a fault either)."""
        return self.counts.get(Signal.DEPART, 0)

    @property
    def faulted_attempts(self) -> int:
        """Attempts that ended by a fault (or are under way): what the recovery policy bounds."""
        return self.attempts - self.moves - self.departures

    @property
    def done(self) -> bool:
        return self.phase.terminal
