"""The route probes' clock: on one thread, time the thread did not run (a neighbour holding the
core, here a sleep) is not counted against the alternative it fell on."""

from __future__ import annotations

import time

import torch

from pdserve.cpu import product_probe
from pdserve.probe_clock import clock_name, probe_clock


def test_one_thread_is_timed_by_its_cpu_time_and_several_by_the_wall_clock():
    assert probe_clock(1) is time.thread_time and clock_name(1) == "thread"
    assert probe_clock(4) is time.perf_counter and clock_name(4) == "wall"


def test_a_product_that_waits_a_millisecond_a_call_costs_the_probe_almost_nothing():
    """Each call sleeps 1 ms (the wall clock would say at least that); the thread's CPU time of a
    sleep is a few microseconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        took = product_probe._time(lambda x, bias: time.sleep(1e-3), torch.zeros(1))
    finally:
        torch.set_num_threads(threads)
    assert took < 0.5e-3
