"""The restart backoff of `pdserve up`: doubling from 0.5 s to a 10 s cap, reset after a good run."""

from __future__ import annotations

from pdserve.cli.restarts import Restart, RestartPolicy


def _delays(policy: RestartPolicy, uptimes: list[float]) -> list[float]:
    streak, delays = 0, []
    for uptime in uptimes:
        restart = policy.after_exit(streak, uptime)
        streak = restart.streak
        delays.append(restart.delay_s)
    return delays


def test_quick_exits_double_the_delay_up_to_the_cap():
    assert _delays(RestartPolicy(), [1.0] * 7) == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_run_as_long_as_the_reset_time_forgives_the_streak():
    assert _delays(RestartPolicy(reset_after_s=30), [1, 1, 1, 30, 1]) == [0.5, 1.0, 2.0, 0.5, 1.0]


def test_the_first_exit_waits_the_first_delay_whatever_the_uptime():
    assert RestartPolicy().after_exit(0, 0.0) == Restart(0.5, 1)
    assert RestartPolicy().after_exit(0, 3600.0) == Restart(0.5, 1)


def test_the_numbers_are_settings():
    policy = RestartPolicy(first_delay_s=0.1, factor=3.0, max_delay_s=1.0, reset_after_s=5.0)
    assert _delays(policy, [0, 0, 0, 0]) == [0.1, 0.1 * 3, 0.1 * 9, 1.0]
