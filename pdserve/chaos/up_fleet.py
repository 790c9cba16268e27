"""`UpFleet`: the whole service as one `pdserve up`, whose supervisor restarts what dies.

The children's pids, ports and restart counts come from the status file `pdserve up
--status-file` rewrites on every start and restart:
    {"router": "127.0.0.1:PORT", "children": [{"name", "role", "pid", "port", "metrics_port", "restarts"}]}
Workers are named here by role and rank (`decode-1` is the second decode child listed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdserve.chaos.fleet import ROLES, Fleet, FleetSpec, WorkerRef, chaos_env
from pdserve.procs.health import serving, wait_serving


class UpFleet(Fleet):
    def __init__(self, spec: FleetSpec):
        self.spec = spec
        self.workdir = Path(tempfile.mkdtemp(prefix="pdserve-chaos-up-"))
        self.status_file = self.workdir / "status.json"
        self.process: subprocess.Popen | None = None
        self._pids: set[int] = set()  # every child pid seen, for the cleanup

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "pdserve.cli.main", "up", "--port", "0", "--http-port", "0",
                "--prefill-workers", str(self.spec.prefill), "--decode-workers", str(self.spec.decode),
                "--kv-timeout", str(self.spec.kv_timeout_s), "--ready-timeout", str(self.spec.ready_timeout_s),
                "--drain-timeout-s", str(self.spec.drain_timeout_s), "--status-file", str(self.status_file),
                "--anonymous-max-priority", "vip",  # the load has VIP requests
                "--reserve-at", self.spec.reserve_at,
                *self.spec.engine_argv()]
        return argv

    def start(self) -> str:
        log = open(self.workdir / "up.log", "w")
        self.process = subprocess.Popen(self.argv(), env=chaos_env(), stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while not self._complete(self._status()):
            if self.process.poll() is not None:
                raise RuntimeError(f"pdserve up exited with {self.process.returncode}; see {self.workdir / 'up.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no complete {self.status_file} after {self.spec.ready_timeout_s:.0f} s")
            time.sleep(0.2)
        target = self._status()["router"]
        wait_serving(target, self.spec.ready_timeout_s)
        return target

    def _status(self) -> dict:
        try:
            status = json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        self._pids.update(c["pid"] for c in status.get("children", ()) if c.get("pid"))
        return status

    def _complete(self, status: dict) -> bool:
        workers = self._by_name(status)
        return bool(status.get("router")) and len(workers) == len(self.spec.names())

    def _by_name(self, status: dict) -> dict[str, dict]:
        named = {}
        for role in ROLES:
            of_role = [c for c in status.get("children", ()) if c.get("role") == role]
            named.update({f"{role}-{rank}": child for rank, child in enumerate(of_role)})
        return named

    def _child(self, name: str) -> dict:
        return self._by_name(self._status())[name]

    def workers(self) -> tuple[WorkerRef, ...]:
        named = self._by_name(self._status())
        return tuple(WorkerRef(n, named[n]["role"], f"127.0.0.1:{named[n]['port']}") for n in self.spec.names())

    def signal(self, name: str, sig: int) -> None:
        _send(self._child(name)["pid"], sig)

    def generation(self, name: str) -> int:
        return 1 + int(self._child(name).get("restarts", 0))

    def restarted(self, name: str, since: int) -> bool:
        child = self._child(name)
        return 1 + int(child.get("restarts", 0)) > since and serving(f"127.0.0.1:{child['port']}")

    def stop(self) -> None:
        for pid in self._pids:
            _send(pid, signal.SIGCONT)
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(self.spec.drain_timeout_s + 15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        for pid in self._pids:
            _send(pid, signal.SIGKILL)

    def logs(self) -> Path:
        """`up.log` here names the folder of the children's logs."""
        return self.workdir

    def describe(self) -> str:
        return f"{self.spec.prefill} prefill + {self.spec.decode} decode workers under `pdserve up` (it restarts them)"


def _send(pid: int, sig: int) -> None:
    """Signals `pid` only while it is still a pdserve process (a pid seen earlier may be reused)."""
    try:
        if b"pdserve.cli.main" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, sig)
    except (FileNotFoundError, ProcessLookupError):
        pass

