"""Placement policies: pure functions of worker snapshots."""

from __future__ import annotations

import pytest

from router.placement.placement import NoWorker, choose_decode, choose_prefill
from router.fleet.workers import Worker


def _w(address: str, role: str, **kw) -> Worker:
    return Worker(address, role, ready=True, **kw)


def test_decode_spreads_in_flight_requests_then_prefers_free_blocks():
    a, b = _w("a", "decode", free_blocks=10), _w("b", "decode", free_blocks=50)
    assert choose_decode([a, b]).address == "b"
    b.assigned = 1
    assert choose_decode([a, b]).address == "a"
    assert choose_decode([a, b], avoid={"a"}).address == "b"


def test_prefill_prefers_the_longest_cached_prefix_then_load():
    a, b = _w("a", "prefill", running=5), _w("b", "prefill")
    assert choose_prefill([a, b], {}).address == "b"
    assert choose_prefill([a, b], {"a": 512, "b": 0}).address == "a"


def test_prefill_prefers_the_earliest_predicted_first_token_over_a_prefix():
    a, b = _w("a", "prefill"), _w("b", "prefill", running=3)
    assert choose_prefill([a, b], {"a": 512}, predicted_s={"a": 5.0, "b": 0.2}).address == "b"
    assert choose_prefill([a, b], {"a": 512}, predicted_s={"a": 0.2, "b": 0.2}).address == "a"


def test_avoided_workers_are_chosen_only_when_nothing_else_is_usable():
    a, b = _w("a", "prefill"), _w("b", "prefill", running=9)
    assert choose_prefill([a, b], {}, avoid={"a"}).address == "b"
    assert choose_prefill([a], {}, avoid={"a"}).address == "a"


def test_of_workers_all_left_one_merely_departed_from_goes_before_one_failed_on():
    a, b = _w("a", "decode", free_blocks=0), _w("b", "decode", free_blocks=50)
    assert choose_decode([a, b], avoid={"a", "b"}).address == "b"  # by load alone
    assert choose_decode([a, b], avoid={"a", "b"}, failed={"b"}).address == "a"
    assert choose_decode([b], avoid={"b"}, failed={"b"}).address == "b"  # nothing else: back to it


def test_no_worker_is_an_error():
    with pytest.raises(NoWorker):
        choose_decode([], ())
    with pytest.raises(NoWorker):
        choose_prefill([], {})


def test_a_worker_a_request_failed_on_is_avoided_until_it_restarts():
    """FlowState.avoided: the fault's incarnation of the worker is avoided; once a poll answers
    after silent ones (a restart, router/fleet/workers.py), the worker is a candidate again."""
    from router.flow.flow_types import FlowState
    from router.flow.protocol import RequestProtocol

    a, b = Worker("a", "decode", ready=True), Worker("b", "decode", ready=True)
    state = FlowState(RequestProtocol("r"))
    state.avoid["decode"]["a"] = a.incarnation
    assert state.avoided("decode", [a, b]) == {"a"}
    a.incarnation += 1
    assert state.avoided("decode", [a, b]) == set()


def test_a_poll_that_answers_after_silent_ones_is_a_new_incarnation():
    import asyncio

    from router.fleet.clients import FaultKind, WorkerFault, WorkerSnapshot
    from router.fleet.workers import PoolConfig, WorkerPool

    class Clients:
        answering = True

        async def stats(self, address, role, timeout_s):
            if not self.answering:
                raise WorkerFault(FaultKind.GONE, address, "down")
            return WorkerSnapshot(8, 8, 0, 0, False)

    async def main():
        clients = Clients()
        pool = WorkerPool(clients, [], ["d0"], PoolConfig())
        await pool.refresh()
        await pool.refresh()
        assert pool.incarnation("d0") == 0  # answering all along
        clients.answering = False
        await pool.refresh()
        clients.answering = True
        await pool.refresh()
        return pool.incarnation("d0")

    assert asyncio.run(main()) == 1
