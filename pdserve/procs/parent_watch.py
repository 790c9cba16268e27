"""A supervised service process ends when its supervisor is gone, however the supervisor died.

The supervisor names itself in the child's environment (`SUPERVISOR_PID_ENV`); the child polls
its parent, and once it has been re-parented (the supervisor exited, even by SIGKILL, with its
own cleanup never run) it stops at once. This holds whichever thread spawned the child, which
the kernel's parent-death signal (`Supervisor.die_with_parent`) does not: that one fires when
the spawning *thread* ends.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping

SUPERVISOR_PID_ENV = "PDSERVE_SUPERVISOR_PID"
POLL_S = 0.5


def supervisor_pid(env: Mapping[str, str]) -> int | None:
    """The supervisor this process was started by, or None when nobody supervises it."""
    value = env.get(SUPERVISOR_PID_ENV, "")
    return int(value) if value.isdigit() else None


async def watch_parent(parent: int, on_gone: Callable[[], None], poll_s: float = POLL_S) -> None:
    """Calls `on_gone` once, when this process's parent is no longer `parent`."""
    while os.getppid() == parent:
        await asyncio.sleep(poll_s)
    on_gone()
