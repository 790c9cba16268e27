"""The request protocol's state machine, the recovery policy and the circuit breaker, alone."""

from __future__ import annotations

import pytest

from pdserve.errors import InvalidRequestError
from pdserve.requests import FinishReason, SamplingParams
from pdserve.rpc.errors import Unavailable
from router.fleet.breaker import BreakerConfig, BreakerState, CircuitBreaker
from router.fleet.clients import Culprit, FaultKind, WorkerFault
from router.flow.protocol import LIVE, TRANSITIONS, Phase, ProtocolError, RequestProtocol, Signal
from router.flow.recovery import Action, RecoveryPolicy, RequestPoisoned, charged_to

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


def _fault(kind=FaultKind.GONE, address="d0", culprit=Culprit.SELF) -> WorkerFault:
    return WorkerFault(kind, address, f"{address}: {kind.value}", culprit)


def test_the_remote_path_and_a_resume():
    p = RequestProtocol("r")
    for signal in (Signal.PLACED, Signal.RESERVED, Signal.CHUNK, Signal.CHUNK, Signal.FIRST_TOKEN, Signal.TOKENS,
                   Signal.RESUME, Signal.PLACED_LOCAL, Signal.TOKENS, Signal.FINISHED):
        p.advance(signal)
    assert p.phase == Phase.FINISHED and p.done and p.attempts == 2


def test_a_transition_outside_the_table_is_refused():
    p = RequestProtocol("r")
    with pytest.raises(ProtocolError):
        p.advance(Signal.TOKENS)
    p.advance(Signal.PLACED)
    with pytest.raises(ProtocolError):
        p.advance(Signal.FIRST_TOKEN)  # no prefill worker was chosen before the reservation
    p.advance(Signal.FAIL)
    with pytest.raises(ProtocolError):
        p.advance(Signal.RETRY)  # terminal


def test_a_fault_in_any_live_phase_can_resume():
    """A resume is placed, reserved and prefilled again: a fault there resumes once more."""
    for phase in LIVE:
        assert TRANSITIONS[(phase, Signal.RESUME)] == Phase.PLACING


def test_a_departed_request_moves_its_kv_then_decodes():
    p = RequestProtocol("r")
    for signal in (Signal.PLACED, Signal.RESERVED, Signal.FIRST_TOKEN, Signal.DEPART, Signal.PLACED,
                   Signal.MOVE_KV, Signal.KV_MOVED, Signal.TOKENS, Signal.FINISHED):
        p.advance(signal)
    assert p.phase == Phase.FINISHED and (p.attempts, p.departures, p.faulted_attempts) == (2, 1, 1)


def test_every_live_phase_can_fail_and_be_cancelled_and_terminal_phases_have_no_exit():
    for phase in LIVE:
        assert TRANSITIONS[(phase, Signal.FAIL)] == Phase.FAILED
        assert TRANSITIONS[(phase, Signal.CANCEL)] == Phase.CANCELLED
    assert not [key for key in TRANSITIONS if key[0].terminal]


def _decide(fault, history=None, generated=(), attempts=1, policy=RecoveryPolicy(), deadline=None):
    return policy.decide(fault, history or [fault], list(generated), GREEDY, attempts, deadline)


def test_recovery_retries_before_the_first_token_and_resumes_after():
    assert _decide(_fault()).action == Action.RETRY
    assert _decide(_fault(), generated=[5]).action == Action.RESUME
    no_resume = RecoveryPolicy(resume_on_decode_failure=False)
    decision = _decide(_fault(), generated=[5], policy=no_resume)
    assert decision.action == Action.FAIL and isinstance(decision.error, Unavailable)


def test_recovery_completes_a_request_whose_last_token_was_already_out():
    decision = _decide(_fault(), generated=[1, 2, 3, 4])
    assert decision.action == Action.COMPLETE and decision.reason == FinishReason.LENGTH
    eos = RecoveryPolicy(eos_token_ids=(2,))
    assert _decide(_fault(), generated=[1, 2], policy=eos).reason == FinishReason.STOP


def test_recovery_fails_refusals_deadlines_poison_and_exhausted_attempts_with_their_status():
    assert isinstance(_decide(_fault(FaultKind.REFUSED)).error, InvalidRequestError)
    assert isinstance(_decide(_fault(), deadline=0.0).error, TimeoutError)
    internal = [_fault(FaultKind.FAILED, "d0"), _fault(FaultKind.FAILED, "d1")]
    assert _decide(internal[0], history=internal[:1]).action == Action.RETRY
    assert isinstance(_decide(internal[1], history=internal).error, RequestPoisoned)
    assert isinstance(_decide(_fault(), attempts=4).error, Unavailable)


def test_recovery_ends_a_request_its_client_aborted_through_another_router_whatever_came_before():
    aborted = _fault(FaultKind.ABORTED, culprit=Culprit.NOBODY)
    for decision in (_decide(aborted), _decide(aborted, generated=[5], attempts=4), _decide(aborted, deadline=0.0)):
        assert (decision.action, decision.reason, decision.error) == (Action.ABORT, FinishReason.ABORT, None)
    assert charged_to(aborted) is None


def test_only_a_worker_found_gone_is_charged():
    assert charged_to(_fault()) == "d0"
    assert charged_to(_fault(FaultKind.FAILED)) is None
    assert charged_to(_fault(FaultKind.TIMEOUT, culprit=Culprit.NOBODY)) is None
    assert charged_to(_fault(FaultKind.REFUSED)) is None


def test_breaker_opens_after_the_threshold_probes_half_open_and_closes_on_success():
    b = CircuitBreaker(BreakerConfig(threshold=2, cooldown_s=1.0, max_cooldown_s=4.0))
    assert not b.on_failure(0.0) and b.allows(0.0)
    assert b.on_failure(0.0) and not b.allows(0.5)
    assert b.allows(1.0) and b.state == BreakerState.HALF_OPEN
    b.on_trial()
    assert not b.allows(1.0)  # one trial at a time
    assert b.on_failure(1.1) and b.cooldown_s == 2.0 and not b.allows(2.0)
    assert b.allows(3.2)
    b.on_success()
    assert b.state == BreakerState.CLOSED and b.failures == 0


def test_a_success_between_failures_keeps_the_breaker_closed():
    b = CircuitBreaker(BreakerConfig(threshold=2))
    for _ in range(5):
        b.on_failure(0.0)
        b.on_success()
    assert b.state == BreakerState.CLOSED
