"""A supervised service stops by itself once its supervisor is gone, even killed by SIGKILL from a
thread other than the one that spawned it (where the kernel's parent-death signal does not help)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pdserve.procs.parent_watch import SUPERVISOR_PID_ENV, supervisor_pid
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

# A supervisor that spawns a router from a worker thread (as the chaos harness restarts workers),
# prints the child's pid once it serves, then waits to be killed without running any cleanup.
SUPERVISOR = textwrap.dedent("""
    import sys, threading, time
    from pdserve.procs.supervisor import Supervisor
    sup = Supervisor()
    def start():
        child = sup.spawn("router", ["router", "--port", "0", "--insecure", "--prefill-workers", "127.0.0.1:1",
                                     "--decode-workers", "127.0.0.1:2"])
        sup.wait_ready(child, 240)
        print(child.pid, flush=True)
    spawner = threading.Thread(target=start)
    spawner.start()
    spawner.join()
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[-1][0] != "Z"


def test_the_supervisor_pid_is_read_from_the_environment_only_when_it_is_a_number():
    assert supervisor_pid({SUPERVISOR_PID_ENV: "4242"}) == 4242
    assert supervisor_pid({}) is None
    assert supervisor_pid({SUPERVISOR_PID_ENV: "me"}) is None


def test_a_router_whose_supervisor_was_sigkilled_stops_by_itself():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True, env=env)
    child = None
    try:
        child = int(supervisor.stdout.readline())
        assert _alive(child)
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(30)
        wait_until(lambda: not _alive(child), 30, "the orphaned router gone")
    finally:
        supervisor.kill()
        if child is not None and _alive(child):
            os.killpg(child, signal.SIGKILL)
