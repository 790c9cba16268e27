"""DECODING: an attempt's decode call driven to its end (router/flow/flow.py opens it): its head
first (the KV's way in: router/flow/reserving.py, router/flow/prefilling.py; or an attach), then
the decode worker's tokens relayed until Finished.

    Tokens          to the client (each once across attempts); after the first, a step's tokens
                    are gathered in the call until the stream interval's N wait (router/flow/stream.py),
                    and where the flow has an outlet (its door's pacer) they go straight to it as
                    they come while nothing waits before them: the request's task wakes for the
                    other events and its periodic check, not for tokens
    Preempted       counted, and a milestone for the trace
    Finished        the request's end
    leaving         its worker drains, changes role, or is under memory pressure while another has
                    room: the request is asked to depart (router/flow/departing.py) and ends the
                    attempt once every token it generated there is out (LeftFor)
    Moved           it left its decode worker's queue for one with room (router/flow/reserving.py)

A move or a departure ends the attempt without a fault; a fault of the decode worker is charged
to it. The attempt's decode call is closed however it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from pdserve.worker.events import Departed, Finished, Preempted, Tokens
from router.fleet.clients import FaultKind, WorkerFault
from router.fleet.workers import WorkerPool
from router.flow.departing import Departer, Leaving, LeftFor
from router.flow.flow_types import Attempt, Blame, FlowConfig, FlowEvent, FlowState, Milestone, NewTokens
from router.flow.protocol import ProtocolError, Signal
from router.flow.reserving import Moved
from router.flow.stream import Gathered

log = logging.getLogger(__name__)


class Decoder:
    def __init__(self, pool: WorkerPool, config: FlowConfig, departer: Departer, blame: Blame):
        self.pool = pool
        self.config = config
        self.departer = departer
        self.blame = blame

    async def drive(self, attempt: Attempt, head: AsyncIterator[FlowEvent]) -> AsyncIterator[FlowEvent]:
        """The attempt from `head` (the KV's way in, or an attach) to its end."""
        job, state, decode = attempt.job, attempt.state, attempt.decode
        try:
            async for event in head:
                yield event
            async for event in self._relay(attempt):
                yield event
            self.pool.credit(decode.address)
        except WorkerFault as fault:
            if fault.address == decode.address:
                self.blame(state, fault, "decode", decode.address)
            raise
        except Moved as moved:
            state.move_to = moved.target
            log.info("request %s moves from %s to %s: %s", job.request_id, decode.address, moved.target, moved)
            state.protocol.advance(Signal.MOVE, f"{decode.address} -> {moved.target}")
            yield Milestone("moved", {"pdserve.from": decode.address, "pdserve.to": moved.target,
                                      "pdserve.waited_s": moved.waited_s})
        except LeftFor as left:
            state.move_to = left.target
            state.departed = (decode.address, attempt.worker_id) if left.kept_kv else None
            state.avoid["decode"][decode.address] = self.pool.incarnation(decode.address)
            log.info("request %s departs from %s (leaving) for %s after %d tokens%s", job.request_id, decode.address,
                     left.target, len(state.generated), "" if left.kept_kv else ", to be prefilled again")
            state.protocol.advance(Signal.DEPART, f"{decode.address} -> {left.target}")
            yield Milestone("departed", {"pdserve.from": decode.address, "pdserve.to": left.target,
                                         "pdserve.generated": len(state.generated), "pdserve.kv_kept": left.kept_kv})
        finally:
            self.pool.left(decode)
            attempt.call.close()

    async def _relay(self, attempt: Attempt) -> AsyncIterator[FlowEvent]:
        """The decode worker's tokens to the end. While that worker is leaving (draining or
        changing role), or under memory pressure, the request departs for another decode
        worker: raises LeftFor once every token it generated there is out. (Asked after each
        event this task reads and at each periodic check: tokens taken straight to the outlet
        do not wake it.)"""
        state, call = attempt.state, attempt.call
        leaving = Leaving()
        gathering = _first_out(state)
        if gathering:
            self._gather(attempt)
        while True:
            try:
                event = await call.next_within(self.config.move_check_s)
            except StopAsyncIteration:
                raise WorkerFault(FaultKind.FAILED, call.address, "the decode worker ended the stream without "
                                                                  "finishing the request") from None
            except asyncio.CancelledError:  # what was gathered goes out as the pacer's held tokens would
                if (gathered := call.gathered()) is not None:
                    yield self._tokens(state, gathered)
                raise
            if isinstance(event, Tokens):
                yield self._out(state, event)
                if not gathering:
                    gathering = True
                    self._gather(attempt)
            elif isinstance(event, Gathered):
                yield self._tokens(state, event)
            elif isinstance(event, Preempted):
                if event.phase == "preempted":  # counted here, on every attempt: a moved or resumed stream's
                    state.by_mode[event.mode] = state.by_mode.get(event.mode, 0) + 1  # earlier ones too
                    state.preemptions += 1
                yield Milestone(f"decode.{event.phase}", {"mode": event.mode, "reason": event.reason})
            elif isinstance(event, Finished):
                state.protocol.advance(Signal.FINISHED)
                yield state.done(event.reason, event.cached_tokens)
                return
            elif isinstance(event, Departed):  # (target None: its Depart call failed, yet it left)
                if event.generated != len(state.generated):
                    raise WorkerFault(FaultKind.FAILED, attempt.decode.address, f"departed after {event.generated} "
                                      f"tokens, {len(state.generated)} received") from None
                raise LeftFor(leaving.target, event.kv_kept)
            if self.departer.wants(attempt, leaving):
                await self.departer.ask(attempt, leaving)

    def _gather(self, attempt: Attempt) -> None:
        """Once the request's first tokens are out: its token events gathered to the stream interval's
        N, and taken straight to the flow's outlet where it has one (the call's reader waiting: every
        event before them is out)."""
        attempt.call.gather(self.config.gather_tokens)
        outlet, state = attempt.state.outlet, attempt.state
        if outlet is None:
            return

        def take(event: object) -> bool:
            try:
                if type(event) is Gathered:
                    new = self._tokens(state, event)
                elif type(event) is Tokens and not event.prompt_logprobs:
                    new = self._out(state, event)
                else:
                    return False
            except ProtocolError:  # (nothing changed yet) raised again by the request's own task
                return False
            outlet(new)
            return True

        attempt.call.take_directly(take)

    @staticmethod
    def _tokens(state: FlowState, gathered: Gathered) -> NewTokens:
        """A gathered run of token events (one step of the protocol) as the client's."""
        return Decoder._out(state, gathered.tokens, gathered.arrived)

    @staticmethod
    def _out(state: FlowState, tokens: Tokens, arrived: tuple[tuple[float, int], ...] = ()) -> NewTokens:
        state.protocol.advance(Signal.TOKENS)
        state.generated.extend(tokens.token_ids)
        return NewTokens(tokens.token_ids, tokens.logprobs, tokens.prompt_logprobs, arrived)


def _first_out(state: FlowState) -> bool:
    """Whether the request's first tokens went to its client (a stream interval sends them at once):
    from then on its token events may be gathered (router/flow/stream.py)."""
    counts = state.protocol.counts
    return bool(counts.get(Signal.TOKENS) or counts.get(Signal.FIRST_TOKEN))
