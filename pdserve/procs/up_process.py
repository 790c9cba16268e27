"""`UpProcess`: a whole service as one `pdserve up` child process, and where its router listens.

    with UpProcess(["--mode", "colocated", "--port", "0"], env, ready_timeout_s=300) as up:
        target = up.router      # "127.0.0.1:PORT", SERVING
    # leaving: SIGTERM (up drains the router, then the workers), SIGKILL after the grace

The router's address comes from the status file `pdserve up --status-file` writes once every
child is ready. `pdserve up` kills its children when it dies (PR_SET_PDEATHSIG).
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

from pdserve.procs.health import wait_serving


class UpProcess:
    def __init__(self, up_flags: list[str], env: dict[str, str], ready_timeout_s: float, stop_grace_s: float = 45.0):
        self.workdir = Path(tempfile.mkdtemp(prefix="pdserve-up-"))
        self.status_file = self.workdir / "status.json"
        self.argv = [sys.executable, "-m", "pdserve.cli.main", "up", *up_flags, "--status-file", str(self.status_file)]
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.process: subprocess.Popen | None = None
        self.router = ""

    def __enter__(self) -> UpProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def log(self) -> Path:
        return self.workdir / "up.log"

    def start(self) -> str:
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout_s
        while not (router := self._router()):
            if self.process.poll() is not None:
                raise RuntimeError(f"pdserve up exited with {self.process.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"pdserve up not ready after {self.ready_timeout_s:.0f} s; see {self.log}")
            time.sleep(0.2)
        wait_serving(router, max(1.0, deadline - time.monotonic()))
        self.router = router
        return router

    def _router(self) -> str:
        try:
            return json.loads(self.status_file.read_text()).get("router") or ""
        except (FileNotFoundError, json.JSONDecodeError):
            return ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(self.stop_grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
