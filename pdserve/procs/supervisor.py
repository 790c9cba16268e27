"""Starts service processes on loopback, waits for them, restarts and stops them. Mechanism
only: when to restart is the caller's choice (see pdserve/cli/fleet.py for `pdserve up`). A child
runs `python -m pdserve.cli.main <argv> --ready-file F`: a command line, not an import.

Each child runs in a process group of its own (signals reach what it started, and a Ctrl-C
at the terminal reaches only the parent, which then stops the children in order). A child stops
by itself once this process is gone, even killed (`parent_watch`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdserve.procs.parent_watch import SUPERVISOR_PID_ENV

PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    ready_file: Path
    port: int | None = None
    metrics_port: int | None = None
    http_port: int | None = None  # the router's HTTP API
    argv: list[str] = field(default_factory=list)  # the subcommand and its flags, without --ready-file
    cpus: set[int] | None = None
    restarts: int = 0
    launcher: tuple[str, ...] = ()  # what runs the command elsewhere (a test host: `ip netns exec NAME`)

    @property
    def role(self) -> str:
        """router, prefill or decode: the subcommand it runs."""
        return self.argv[0] if self.argv else self.name

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> bool:
        return self.process.poll() is not None


@dataclass
class Supervisor:
    """Owns the child processes; `stop()` (also on exit) terminates, then kills, all of them.
    With `die_with_parent`, the kernel kills every child when this process dies (even by SIGKILL);
    only for a parent that spawns from its main thread (the death of the spawning thread counts)."""

    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    children: list[Child] = field(default_factory=list)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pdserve-")))
    die_with_parent: bool = False

    def spawn(self, name: str, argv: list[str], cpus: set[int] | None = None, log: bool = True,
              launcher: tuple[str, ...] = ()) -> Child:
        """`launcher`: a prefix that runs the command elsewhere and execs it (pdserve/procs/hosts.py's
        test hosts: the child keeps the process it was started as)."""
        ready = self.workdir / f"{name}.port"
        out = self.workdir / f"{name}.log" if log else None
        child = Child(name, self._launch(argv, cpus, ready, out, "w", launcher), ready, argv=list(argv), cpus=cpus,
                      launcher=tuple(launcher))
        self.children.append(child)
        return child

    def respawn(self, child: Child) -> None:
        """Start an exited child again with the same flags, on the ports it had (if it ever got
        as far as binding them), so that whoever dials it finds it where it was."""
        assert child.exited(), f"{child.name} is still running"
        pinned = [*child.argv]  # NOTE: a flag given twice: the last one counts
        if child.port is not None:
            pinned += ["--port", str(child.port)]
        if child.metrics_port is not None:
            pinned += ["--metrics-port", str(child.metrics_port)]
        if child.http_port is not None:
            pinned += ["--http-port", str(child.http_port)]
        child.restarts += 1
        child.process = self._launch(pinned, child.cpus, child.ready_file, self.log_of(child), "a", child.launcher)

    def _launch(self, argv: list[str], cpus: set[int] | None, ready: Path, log: Path | None,
                mode: str, launcher: tuple[str, ...] = ()) -> subprocess.Popen:
        ready.unlink(missing_ok=True)
        cmd = [*launcher, sys.executable, "-m", "pdserve.cli.main", *argv, "--ready-file", str(ready)]
        out = open(log, mode) if log else subprocess.DEVNULL
        try:
            return subprocess.Popen(cmd, env={**self.env, SUPERVISOR_PID_ENV: str(os.getpid())}, stdout=out,
                                    stderr=subprocess.STDOUT,
                                    preexec_fn=self._preexec(cpus), start_new_session=True)
        finally:
            if log:
                out.close()

    def _preexec(self, cpus: set[int] | None):
        die_with_parent = self.die_with_parent
        if not (cpus or die_with_parent):
            return None

        def setup() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)
            if die_with_parent:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

        return setup

    def poll_ready(self, child: Child) -> bool:
        """True once the child wrote its ready file (its ports are then set)."""
        if not child.ready_file.exists():
            return False
        ready = json.loads(child.ready_file.read_text())
        child.port, child.metrics_port, child.http_port = ready["port"], ready["metrics_port"], ready.get("http_port")
        return True

    def wait_ready(self, child: Child, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if child.exited():
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}; see {self.log_of(child)}")
            if self.poll_ready(child):
                return child.port
            time.sleep(0.1)
        raise TimeoutError(f"{child.name} not ready after {timeout_s:.0f} s; see {self.log_of(child)}")

    def log_of(self, child: Child) -> Path:
        return self.workdir / f"{child.name}.log"

    def kill(self, child: Child, sig: int = signal.SIGKILL) -> None:
        """Signal the child's whole process group, while the child runs."""
        if not child.exited():
            os.killpg(child.process.pid, sig)

    def wait_exit(self, child: Child, timeout_s: float) -> int:
        """Wait for the child to exit; kill its group if it takes longer. Its exit code."""
        try:
            child.process.wait(max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            self.kill(child)
            child.process.wait(5)
        return child.process.returncode

    def stop(self, grace_s: float = 5.0) -> None:
        for child in self.children:
            if not child.exited():
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            self.wait_exit(child, deadline - time.monotonic())
