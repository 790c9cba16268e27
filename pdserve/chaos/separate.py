"""`SeparateFleet`: each worker its own `pdserve prefill|decode` process, the router another.

A watcher thread plays the platform: a worker process that exited (killed, drained, crashed)
is started again on the same port `restart_delay_s` later, under the same name.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from pdserve.chaos.fleet import Fleet, FleetSpec, WorkerRef, chaos_env, role_of, serving
from pdserve.cli.supervisor import Child, Supervisor
from pdserve.cli.up import wait_serving


@dataclass
class _Slot:
    name: str
    child: Child | None = None
    port: int = 0  # 0 until the first process bound one; kept for every restart
    generation: int = 0
    exited_at: float | None = None


class SeparateFleet(Fleet):
    def __init__(self, spec: FleetSpec):
        self.spec = spec
        self.sup = Supervisor(env=chaos_env())
        self.slots = {name: _Slot(name) for name in spec.names()}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="chaos-fleet-watch", daemon=True)

    def start(self) -> str:
        for slot in self.slots.values():
            self._spawn(slot)
        for slot in self.slots.values():
            slot.port = self.sup.wait_ready(slot.child, self.spec.ready_timeout_s)
        router = self.sup.spawn("router", self._router_argv())
        target = f"127.0.0.1:{self.sup.wait_ready(router, self.spec.ready_timeout_s)}"
        wait_serving(target, self.spec.ready_timeout_s)
        self._watcher.start()
        return target

    def _worker_argv(self, slot: _Slot) -> list[str]:
        return [role_of(slot.name), "--port", str(slot.port), "--threads", str(self.spec.threads),
                "--drain-timeout-s", str(self.spec.drain_timeout_s), *self.spec.engine_argv()]

    def _router_argv(self) -> list[str]:
        by_role = {role: ",".join(w.address for w in self.workers() if w.role == role) for role in ("prefill", "decode")}
        return ["router", "--port", "0", "--prefill-workers", by_role["prefill"], "--decode-workers", by_role["decode"],
                "--kv-timeout", str(self.spec.kv_timeout_s), "--decode-failover", "resume"]

    def _spawn(self, slot: _Slot) -> None:
        slot.generation += 1
        slot.child = self.sup.spawn(f"{slot.name}.{slot.generation}", self._worker_argv(slot))

    def _watch(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                for slot in self.slots.values():
                    self._tend(slot)

    def _tend(self, slot: _Slot) -> None:
        if slot.child.process.poll() is None:
            return
        now = time.monotonic()
        if slot.exited_at is None:
            slot.exited_at = now
        elif now - slot.exited_at >= self.spec.restart_delay_s:
            slot.exited_at = None
            self._spawn(slot)

    def workers(self) -> tuple[WorkerRef, ...]:
        return tuple(WorkerRef(s.name, role_of(s.name), f"127.0.0.1:{s.port}") for s in self.slots.values())

    def signal(self, name: str, sig: int) -> None:
        with self._lock:
            process = self.slots[name].child.process
            if process.poll() is None:
                try:
                    os.kill(process.pid, sig)
                except ProcessLookupError:
                    pass

    def generation(self, name: str) -> int:
        with self._lock:
            return self.slots[name].generation

    def restarted(self, name: str, since: int) -> bool:
        with self._lock:
            slot = self.slots[name]
            fresh = slot.generation > since and slot.child.ready_file.exists() and slot.child.process.poll() is None
        return fresh and serving(f"127.0.0.1:{slot.port}")

    def stop(self) -> None:
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join()
        for name in self.slots:
            if self.slots[name].child is not None:
                self.signal(name, signal.SIGCONT)
        self.sup.stop()

    def describe(self) -> str:
        return (f"{self.spec.prefill} prefill + {self.spec.decode} decode workers, each its own process, restarted "
                f"by the harness {self.spec.restart_delay_s:g} s after it exits")
