"""The step meter: prefill speed over the steps that computed prompt tokens, step seconds over every
step that computed anything, both following the last seconds of stepping."""

from __future__ import annotations

import pytest

from pdserve.engine.step_meter import StepMeter


def _step(meter: StepMeter, prefill_chunks: tuple[int, ...], decodes: int, seconds: float) -> None:
    """A step of prefill chunks of those sizes and `decodes` decodes, as the engine reports it."""
    meter.record(sum(prefill_chunks) + decodes, len(prefill_chunks) + decodes, seconds)


def test_the_calibration_stands_until_a_prefill_ran_and_decodes_set_only_the_step_time():
    meter = StepMeter(prefill_tokens_per_s=5000.0)
    assert (meter.rates.prefill_tokens_per_s, meter.rates.step_s) == (5000.0, 0.0)
    _step(meter, (), 2, 0.02)
    assert (meter.rates.prefill_tokens_per_s, meter.rates.step_s) == (5000.0, 0.02)
    meter.record(0, 0, 1.0)  # an idle step changes nothing
    assert meter.rates.step_s == 0.02


def test_rates_follow_the_recent_steps():
    meter = StepMeter(prefill_tokens_per_s=5000.0, half_life_s=1.0)
    for _ in range(40):  # 20 s of 1000 tokens/s prefill steps
        _step(meter, (501,), 1, 0.5)  # 500 prompt tokens beyond the chunk's first
    assert meter.rates.prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-3)
    assert meter.rates.step_s == pytest.approx(0.5)
    _step(meter, (1001,), 0, 1.0)  # one half-life at 1000 tokens/s: unchanged
    assert meter.rates.prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-3)
    _step(meter, (4001,), 0, 1.0)  # one half-life at 4000: halfway there
    assert meter.rates.prefill_tokens_per_s == pytest.approx(2500.0, rel=1e-2)


def test_a_half_life_must_be_positive():
    with pytest.raises(ValueError):
        StepMeter(1000.0, half_life_s=0)
