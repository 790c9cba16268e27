"""An elastic split's planner in the simulator: the router's own policy (pdserve/elastic) on the
simulated clock.

    every period_s while anything is left to run:
        signals = each instance as the router's pool sees a worker (role, queued prompt tokens,
                  prefill speed, running, waiting, KV blocks, last step's seconds)
        change  = PlannerPolicy.observe(signals, now)        # the service's class, unchanged
        flow.change_role(change)                             # begins it; the flow completes it

The flow (disagg.py) carries a change out the way a worker does (docs/ARCHITECTURE.md, "Workers
that change role"): the instance takes no new work of its old role at once, a decode instance's
requests not yet reserved (or whose prompts still wait for a prefill) go elsewhere, its running
ones move with their KV (--on-leave move), and it serves in its new role once it holds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pdserve.elastic import FleetSignals, PlannerPolicy, RoleChange, WorkerSignals
from pdserve.sim.events import EventLoop
from pdserve.sim.instance import Instance

PERIOD_S = 1.0  # the router's --planner-period-s default


class SimPlanner:
    def __init__(self, loop: EventLoop, policy: PlannerPolicy, observe: Callable[[], FleetSignals],
                 change_role: Callable[[RoleChange], None], period_s: float = PERIOD_S):
        self._loop, self._policy, self._observe, self._change = loop, policy, observe, change_role
        self._period_s = period_s
        loop.at(period_s, self._tick)

    def _tick(self) -> None:
        change = self._policy.observe(self._observe(), self._loop.now)
        if change is not None:
            self._change(change)
        if self._loop.pending():  # arrivals or steps still to come: keep watching
            self._loop.at(self._loop.now + self._period_s, self._tick)


def fleet_signals(instances: Iterable[Instance], changing: Iterable[str]) -> FleetSignals:
    """The instances as the router's planner sees workers (router/fleet/planning.py signals_of)."""
    moving = set(changing)
    return FleetSignals(tuple(_signals(i, i.name in moving) for i in instances))


def _signals(instance: Instance, changing: bool) -> WorkerSignals:
    stats = instance.scheduler.stats()
    return WorkerSignals(instance.name, instance.role.value, True, changing,
                         instance.scheduler.queued_prefill_tokens(), instance.prefill_tokens_per_s,
                         stats.running + stats.receiving, stats.waiting, stats.kv.free + stats.kv.cached,
                         stats.kv.total, instance.last_step_s)
