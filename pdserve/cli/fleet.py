"""`pdserve up` keeps its children running: a child that exits is restarted after a backoff on
the ports it had, and `drain()` stops them in order.

    STARTING --ready file--> SERVING
        |                       |
        +------- exited --------+--> WAITING --backoff over--> STARTING (respawned)
    any state --drain()--> STOPPING (never restarted)

Workers keep their addresses, so the router's static worker list stays valid: it takes a
restarted worker back once that worker's Stats answer again.
"""

from __future__ import annotations

import enum
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdserve.cli.restarts import RestartPolicy
from pdserve.procs.supervisor import Child, Supervisor

DRAIN_GRACE_S = 10.0  # beyond --drain-timeout-s: for a child to stop once drained


class ChildState(enum.Enum):
    STARTING = "starting"  # spawned; its ready file not yet written
    SERVING = "serving"
    WAITING = "waiting"  # exited; restarted once its backoff is over
    STOPPING = "stopping"  # drained or drained away: never restarted


@dataclass
class Watch:
    child: Child
    state: ChildState = ChildState.STARTING
    started: float = 0.0  # the fleet's clock at the latest start
    streak: int = 0  # exits in a row (see RestartPolicy)
    due: float = 0.0  # when WAITING: the fleet's clock at the restart


class Fleet:
    """Call `tick()` often (a few times a second): every transition happens there."""

    def __init__(self, sup: Supervisor, policy: RestartPolicy = RestartPolicy(), status_file: Path | None = None,
                 say: Callable[[str], None] = lambda line: print(line, flush=True),
                 clock: Callable[[], float] = time.monotonic, cluster_token_file: Path | None = None):
        """`cluster_token_file`: the children's token, named in the status for tools that call
        the workers' internal RPCs."""
        self.sup = sup
        self.cluster_token_file = cluster_token_file
        self.clock = clock
        self.policy = policy
        self.status_file = status_file
        self.say = say
        self.watches: list[Watch] = []

    def adopt(self) -> None:
        """Watch every child of the supervisor not watched yet, as serving (call once they are
        ready: an exit during start-up is the caller's error, not a restart)."""
        watched = {id(w.child) for w in self.watches}
        now = self.clock()
        self.watches += [Watch(c, ChildState.SERVING, started=now) for c in self.sup.children if id(c) not in watched]
        self.write_status()

    def tick(self) -> None:
        now = self.clock()
        for watch in self.watches:
            self._advance(watch, now)

    def _advance(self, watch: Watch, now: float) -> None:
        state, child = watch.state, watch.child
        if state in (ChildState.STARTING, ChildState.SERVING) and child.exited():
            self._on_exit(watch, now)
        elif state is ChildState.WAITING and now >= watch.due:
            self._restart(watch)
        elif state is ChildState.STARTING and self.sup.poll_ready(child):
            watch.state = ChildState.SERVING
            self.say(f"{child.name} serving again on 127.0.0.1:{child.port} (restart {child.restarts})")
            self.write_status()

    def _on_exit(self, watch: Watch, now: float) -> None:
        child = watch.child
        uptime = now - watch.started
        restart = self.policy.after_exit(watch.streak, uptime)
        watch.state, watch.streak, watch.due = ChildState.WAITING, restart.streak, now + restart.delay_s
        self.say(f"{child.name} (pid {child.pid}) {describe_exit(child.process.returncode)} after {uptime:.1f} s; "
                 f"restarting in {restart.delay_s:.1f} s; see {self.sup.log_of(child)}")

    def _restart(self, watch: Watch) -> None:
        self.sup.respawn(watch.child)
        watch.state, watch.started = ChildState.STARTING, self.clock()
        self.say(f"{watch.child.name} restarted (pid {watch.child.pid}, restart {watch.child.restarts})")
        self.write_status()

    def drain(self, drain_timeout_s: float) -> None:
        """The routers first (they refuse new work and finish what is in flight), then every
        worker; each gets SIGTERM and drain_timeout_s (+ a grace) before it is killed."""
        for watch in self.watches:
            watch.state = ChildState.STOPPING
        routers = [w.child for w in self.watches if w.child.role == "router"]
        workers = [w.child for w in self.watches if w.child.role != "router"]
        for group in (routers, workers):
            self._stop_all(group, drain_timeout_s + DRAIN_GRACE_S)

    def _stop_all(self, children: list[Child], timeout_s: float) -> None:
        running = [c for c in children if not c.exited()]
        for child in running:
            self.sup.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in running:
            code = self.sup.wait_exit(child, deadline - time.monotonic())
            self.say(f"{child.name} (pid {child.pid}) {describe_exit(code)}")

    def write_status(self) -> None:
        """Atomically, so that a reader never sees half a file."""
        if self.status_file is None:
            return
        tmp = self.status_file.with_name(f"{self.status_file.name}.tmp")
        tmp.write_text(json.dumps(self.status()))
        os.replace(tmp, self.status_file)

    def status(self) -> dict:
        """`router`, `http`: the first router's addresses; `routers`: every router's."""
        routers = [_addresses(w.child) for w in self.watches if w.child.role == "router" and w.child.port]
        first = routers[0] if routers else {"grpc": None, "http": None}
        return {
            "router": first["grpc"],
            "http": first["http"],
            "routers": routers,
            "cluster_token_file": str(self.cluster_token_file) if self.cluster_token_file else None,
            "children": [{"name": w.child.name, "role": w.child.role, "pid": w.child.pid, "port": w.child.port,
                          "metrics_port": w.child.metrics_port, "restarts": w.child.restarts,
                          "state": w.state.value} for w in self.watches],
        }


def _addresses(router: Child) -> dict:
    return {"name": router.name, "grpc": f"127.0.0.1:{router.port}",
            "http": f"http://127.0.0.1:{router.http_port}/v1" if router.http_port else None}


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
