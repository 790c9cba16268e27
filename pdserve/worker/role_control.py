"""Carries out an elastic worker's change of role (pdserve/worker/role.py): SetRole marks it, a task
waits until no work of the old role is left here, then switches and tells the registry. The
WorkerControl servicer is the wire side."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.role import RoleState

log = logging.getLogger(__name__)


class RoleControl:
    def __init__(self, state: RoleState, in_flight: Mapping[str, Callable[[], int]],
                 on_switch: Callable[[str], None] = lambda role: None, poll_s: float = 0.05,
                 on_leave: Mapping[str, Callable[[], int]] | None = None):
        """`in_flight[role]()`: the requests of that role this worker still serves;
        `on_leave[role]()`, when a change away from that role begins: give back what is cheap to
        redo elsewhere (a decode worker: requests no KV has reached yet), how many."""
        self.state = state
        self.in_flight = in_flight
        self.on_leave = on_leave or {}
        self.on_switch = on_switch
        self.poll_s = poll_s
        self._task: asyncio.Task | None = None

    def set(self, role: str) -> None:
        """Mark the change (at once when no work of the old role is left), else leave it to a task."""
        self.state.set(role)
        if self.state.next_role is None:
            return
        leave = self.on_leave.get(self.state.role)
        if leave is not None and (given := leave()):
            log.warning("gave back %d %s requests no work had reached yet", given, self.state.role)
        if self._switched():
            return
        log.warning("leaving the %s role for %s once its %d requests here are done", self.state.role,
                    self.state.next_role, self.in_flight[self.state.role]())
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._settle())

    async def _settle(self) -> None:
        while self.state.next_role is not None and not self._switched():
            await asyncio.sleep(self.poll_s)

    def _switched(self) -> bool:
        if self.in_flight[self.state.role]() > 0:
            return False
        role = self.state.switch()
        log.warning("now serving the %s role", role)
        self.on_switch(role)
        return True

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class WorkerControlServicer(worker_pb2_grpc.WorkerControlServicer):
    def __init__(self, control: RoleControl):
        self.control = control

    async def SetRole(self, request: wpb.SetRoleRequest, context) -> wpb.SetRoleResponse:
        self.control.set(request.role)
        state = self.control.state
        return wpb.SetRoleResponse(role=state.role, next_role=state.next_role or "")
