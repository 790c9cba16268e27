"""Faults in an engine step: whose they are, and a switch that injects one on demand.

    RequestFault(request_id, cause)    one request is at fault: AsyncEngine aborts it, its
                                       stream fails, every other request goes on
    any other exception in a step      the engine itself is broken: AsyncEngine stops and every
                                       call fails with EngineFailed

Injection is for tests and the chaos harness, and off unless PDSERVE_FAULT_INJECT_FILE names a
path: before each step the engine claims that file if it exists (renames it away, then deletes
it) and the step raises. An empty file injects a fatal fault; a file reading `request <id>`
injects a RequestFault for that request; one reading `pace <seconds>` raises nothing but makes
every later step wait that long first (a slow device: a test's streams last however fast the
machine is), until a file reads `pace 0`. `{pid}` in the path stands for the process id, so one
setting shared by several workers still aims at one of them. Unset, a step pays nothing (no
file is looked at).
"""

from __future__ import annotations

import abc
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

INJECT_ENV = "PDSERVE_FAULT_INJECT_FILE"


class RequestFault(Exception):
    """An engine step failed because of one request.

    NOTE: raise it only where the step can be abandoned: the engine aborts the request and the
    next step starts from the scheduler's state as it stands (nothing of this step was applied).
    """

    def __init__(self, request_id: str, cause: BaseException):
        super().__init__(f"request {request_id!r} failed in an engine step: {cause!r}")
        self.request_id = request_id
        self.cause = cause


class InjectedFault(RuntimeError):
    """The fault a FaultInjector raises on purpose."""


class FaultInjector(abc.ABC):
    @abc.abstractmethod
    def check(self) -> None:
        """Called on the engine thread before each step; raises the fault to inject, if any."""


class NoFaults(FaultInjector):
    def check(self) -> None:
        return None


class FileTrigger(FaultInjector):
    """Injects one fault each time `path` appears."""

    def __init__(self, path: Path, sleep: Callable[[float], None] = time.sleep):
        self.path = path
        self.sleep = sleep
        self.pace_s = 0.0  # each step waits this long first (`pace <seconds>`)
        self._claimed = path.with_name(f"{path.name}.{os.getpid()}.claimed")

    def check(self) -> None:
        text = claim_file(self.path, self._claimed)
        if text is not None:
            kind, _, argument = text.partition(" ")
            if kind != "pace":
                raise _fault_for(text)
            self.pace_s = max(0.0, float(argument))
        if self.pace_s:
            self.sleep(self.pace_s)


def claim_file(path: Path, claimed: Path) -> str | None:
    """Take the file at `path` if it is there (renamed to `claimed`, read, deleted): its text, or
    None when there was none. Of several processes watching one path, one claims each file."""
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None
    text = claimed.read_text().strip()
    claimed.unlink(missing_ok=True)
    return text


def _fault_for(text: str) -> Exception:
    kind, _, request_id = text.partition(" ")
    if kind == "request" and request_id:
        return RequestFault(request_id, InjectedFault("injected request fault"))
    return InjectedFault("injected engine fault")


def injector_from_env(env: Mapping[str, str], pid: int | None = None) -> FaultInjector:
    path = env.get(INJECT_ENV)
    if not path:
        return NoFaults()
    return FileTrigger(Path(path.replace("{pid}", str(os.getpid() if pid is None else pid))))
