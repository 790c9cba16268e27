"""`SeparateFleet`: each worker its own `pdserve prefill|decode` process, the router another.

A watcher thread plays the platform: a worker process that exited (killed, drained, crashed)
is started again on the same port `restart_delay_s` later (`Supervisor.respawn`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from pdserve.chaos.fleet import Fleet, FleetSpec, WorkerRef, chaos_env, role_of
from pdserve.procs.health import serving, wait_serving
from pdserve.procs.supervisor import Child, Supervisor


class SeparateFleet(Fleet):
    def __init__(self, spec: FleetSpec):
        self.spec = spec
        self.sup = Supervisor(env=chaos_env())
        self.children: dict[str, Child] = {}
        self._exited_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="chaos-fleet-watch", daemon=True)

    def start(self) -> str:
        for name in self.spec.names():
            self.children[name] = self.sup.spawn(name, self._worker_argv(name), launcher=self._launcher(name))
        for child in self.children.values():
            self.sup.wait_ready(child, self.spec.ready_timeout_s)
        router = self.sup.spawn("router", self._router_argv(), launcher=self._launcher("router"))
        target = f"{self._host('router')}:{self.sup.wait_ready(router, self.spec.ready_timeout_s)}"
        wait_serving(target, self.spec.ready_timeout_s)
        self._watcher.start()
        return target

    def _host(self, name: str) -> str:
        """The address process `name` (a worker's name, or "router") listens on."""
        return "127.0.0.1"

    def _launcher(self, name: str) -> tuple[str, ...]:
        """What starts process `name` where it runs (nothing: here)."""
        return ()

    def _worker_argv(self, name: str) -> list[str]:
        return [role_of(name), "--host", self._host(name), "--port", "0", "--threads", str(self.spec.threads),
                "--drain-timeout-s", str(self.spec.drain_timeout_s), *self.spec.engine_argv(), "--insecure"]

    def _router_argv(self) -> list[str]:
        by_role = {role: ",".join(w.address for w in self.workers() if w.role == role) for role in ("prefill", "decode")}
        return ["router", "--host", self._host("router"), "--port", "0", "--prefill-workers", by_role["prefill"], "--decode-workers", by_role["decode"],
                "--kv-timeout", str(self.spec.kv_timeout_s), "--decode-failover", "resume",
                "--reserve-at", self.spec.reserve_at,
                "--anonymous-max-priority", "vip", "--insecure"]  # the load has VIP requests

    def _watch(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                for name, child in self.children.items():
                    self._tend(name, child)

    def _tend(self, name: str, child: Child) -> None:
        if not child.exited():
            return
        now = time.monotonic()
        exited_at = self._exited_at.setdefault(name, now)
        if now - exited_at >= self.spec.restart_delay_s:
            del self._exited_at[name]
            self.sup.respawn(child)

    def workers(self) -> tuple[WorkerRef, ...]:
        return tuple(WorkerRef(n, role_of(n), f"{self._host(n)}:{c.port}") for n, c in self.children.items())

    def signal(self, name: str, sig: int) -> None:
        with self._lock:
            child = self.children[name]
            if not child.exited():
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass

    def generation(self, name: str) -> int:
        with self._lock:
            return 1 + self.children[name].restarts

    def restarted(self, name: str, since: int) -> bool:
        with self._lock:
            child = self.children[name]
            fresh = 1 + child.restarts > since and not child.exited() and child.ready_file.exists()
        return fresh and serving(f"{self._host(name)}:{child.port}")

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join()
        for name in self.children:
            self.signal(name, signal.SIGCONT)
        self.sup.stop()

    def logs(self) -> Path:
        return self.sup.workdir

    def describe(self) -> str:
        return (f"{self.spec.prefill} prefill + {self.spec.decode} decode workers, each its own process, restarted "
                f"by the harness {self.spec.restart_delay_s:g} s after it exits")
