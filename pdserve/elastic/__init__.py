"""The elastic fleet's policies over numbers: when a worker should change role (planner.py), from
what the fleet reports (signals.py). The router runs them (router/fleet/planning.py); the simulator can."""

from pdserve.elastic.planner import PlannerPolicy, RoleChange
from pdserve.elastic.signals import FleetSignals, WorkerSignals

__all__ = ["FleetSignals", "PlannerPolicy", "RoleChange", "WorkerSignals"]
