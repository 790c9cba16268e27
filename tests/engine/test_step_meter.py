"""The step meter: prefill speed over the steps that computed prompt tokens, step seconds over every
step that computed anything, both following the last seconds of stepping."""

from __future__ import annotations

import pytest

from pdserve.engine.step_meter import StepMeter
from pdserve.requests import Request
from pdserve.scheduler.output import ScheduledChunk


def _prefill(tokens: int) -> ScheduledChunk:
    request = Request("p", list(range(tokens)))
    return ScheduledChunk(request, 0, tokens, (), True)


def _decode() -> ScheduledChunk:
    request = Request("d", [1, 2, 3], output_token_ids=[4])
    return ScheduledChunk(request, 3, 1, (), True)


def test_the_calibration_stands_until_a_prefill_ran_and_decodes_set_only_the_step_time():
    meter = StepMeter(prefill_tokens_per_s=5000.0)
    assert (meter.rates.prefill_tokens_per_s, meter.rates.step_s) == (5000.0, 0.0)
    meter.record((_decode(), _decode()), 0.02)
    assert (meter.rates.prefill_tokens_per_s, meter.rates.step_s) == (5000.0, 0.02)
    meter.record((), 1.0)  # an idle step changes nothing
    assert meter.rates.step_s == 0.02


def test_rates_follow_the_recent_steps():
    meter = StepMeter(prefill_tokens_per_s=5000.0, half_life_s=1.0)
    for _ in range(40):  # 20 s of 1000 tokens/s prefill steps
        meter.record((_prefill(500), _decode()), 0.5)
    assert meter.rates.prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-3)
    assert meter.rates.step_s == pytest.approx(0.5)
    meter.record((_prefill(1000),), 1.0)  # one half-life at 1000 tokens/s: unchanged
    assert meter.rates.prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-3)
    meter.record((_prefill(4000),), 1.0)  # one half-life at 4000: halfway there
    assert meter.rates.prefill_tokens_per_s == pytest.approx(2500.0, rel=1e-2)


def test_a_half_life_must_be_positive():
    with pytest.raises(ValueError):
        StepMeter(1000.0, half_life_s=0)
