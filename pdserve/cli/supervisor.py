"""Starts service processes on loopback, waits for them, and stops every one of them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    ready_file: Path
    port: int | None = None
    metrics_port: int | None = None


@dataclass
class Supervisor:
    """Owns the child processes; `stop()` (also on exit) terminates, then kills, all of them."""

    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: list[Child] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pdserve-")))

    def spawn(self, name: str, argv: list[str], cpus: set[int] | None = None, log: bool = True) -> Child:
        ready = self.workdir / f"{name}.port"
        cmd = [sys.executable, "-m", "pdserve.cli.main", *argv, "--ready-file", str(ready)]
        out = open(self.workdir / f"{name}.log", "w") if log else subprocess.DEVNULL
        preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec,
                                start_new_session=True)
        child = Child(name, proc, ready)
        self.children.append(child)
        return child

    def wait_ready(self, child: Child, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}; see {self.log_of(child)}")
            if child.ready_file.exists():
                ready = json.loads(child.ready_file.read_text())
                child.port, child.metrics_port = ready["port"], ready["metrics_port"]
                return child.port
            time.sleep(0.1)
        raise TimeoutError(f"{child.name} not ready after {timeout_s:.0f} s; see {self.log_of(child)}")

    def log_of(self, child: Child) -> Path:
        return self.workdir / f"{child.name}.log"

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        if child.process.poll() is None:
            os.killpg(child.process.pid, sig)

    def stop(self, grace_s: float = 5.0) -> None:
        for child in self.children:
            if child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(child)
                child.process.wait(5)
