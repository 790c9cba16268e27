"""`pdserve up`'s fleet without real processes: restarts on the same ports after the backoff,
the status file at every start, and the drain order (router, then workers)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass, field

from pdserve.cli.fleet import ChildState, Fleet
from pdserve.cli.supervisor import Supervisor


class FakeProcess:
    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            raise subprocess.TimeoutExpired("fake", timeout)
        return self.returncode


@dataclass
class FakeSupervisor(Supervisor):
    """Spawns nothing: each launch is a FakeProcess; signals are recorded, SIGTERM ends it."""

    launched: list[list[str]] = field(default_factory=list)
    signals: list[tuple[str, int]] = field(default_factory=list)

    def _launch(self, argv, cpus, ready, log, mode, launcher=()):
        ready.unlink(missing_ok=True)
        self.launched.append(list(argv))
        return FakeProcess(1000 + len(self.launched))

    def kill(self, child, sig=signal.SIGKILL):
        self.signals.append((child.name, sig))
        if not child.exited():
            child.process.returncode = 0 if sig == signal.SIGTERM else -sig


def _ready(child, port: int, metrics_port: int) -> None:
    child.ready_file.write_text(json.dumps({"port": port, "metrics_port": metrics_port}))


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def _fleet(tmp_path) -> tuple[Fleet, FakeSupervisor, Clock, list[str]]:
    sup = FakeSupervisor(workdir=tmp_path)
    lines: list[str] = []
    clock = Clock()
    fleet = Fleet(sup, status_file=tmp_path / "status.json", say=lines.append, clock=clock)
    for name, argv, port in (("decode-0", ["decode", "--port", "0", "--metrics-port", "0"], 7001),
                             ("router", ["router", "--port", "0"], 7000)):
        child = sup.spawn(name, argv)
        _ready(child, port, port + 1000)
        sup.wait_ready(child, 1)
    fleet.adopt()
    return fleet, sup, clock, lines


def _status(tmp_path) -> dict:
    return json.loads((tmp_path / "status.json").read_text())


def test_the_status_file_names_the_router_and_every_child(tmp_path):
    fleet, _, _, _ = _fleet(tmp_path)
    status = _status(tmp_path)
    assert status["router"] == "127.0.0.1:7000"
    assert status["routers"] == [{"name": "router", "grpc": "127.0.0.1:7000", "http": None}]
    assert [(c["name"], c["role"], c["pid"], c["port"], c["metrics_port"], c["restarts"]) for c in status["children"]] \
        == [("decode-0", "decode", 1001, 7001, 8001, 0), ("router", "router", 1002, 7000, 8000, 0)]


def test_an_exited_worker_is_restarted_after_the_backoff_on_its_ports(tmp_path):
    fleet, sup, clock, lines = _fleet(tmp_path)
    decode = fleet.watches[0].child
    decode.process.returncode = -signal.SIGKILL
    fleet.tick()
    assert fleet.watches[0].state is ChildState.WAITING and "killed by SIGKILL" in lines[-1]
    fleet.tick()
    assert len(sup.launched) == 2  # not before the backoff is over
    clock.offset += 0.6
    fleet.tick()
    assert fleet.watches[0].state is ChildState.STARTING
    assert sup.launched[-1][-4:] == ["--port", "7001", "--metrics-port", "8001"]
    assert _status(tmp_path)["children"][0]["restarts"] == 1 and _status(tmp_path)["children"][0]["pid"] == 1003
    _ready(decode, 7001, 8001)
    fleet.tick()
    assert fleet.watches[0].state is ChildState.SERVING and "serving again on 127.0.0.1:7001" in lines[-1]


def test_quick_exits_in_a_row_wait_longer_each_time(tmp_path):
    fleet, _, clock, _ = _fleet(tmp_path)
    watch = fleet.watches[0]
    waits = []
    for _ in range(4):
        watch.child.process.returncode = 70
        fleet.tick()
        waits.append(round(watch.due - clock(), 1))
        clock.offset += 20
        fleet.tick()
    assert waits == [0.5, 1.0, 2.0, 4.0]
    assert fleet.sup.launched[-1] == ["decode", "--port", "0", "--metrics-port", "0", "--port", "7001",
                                      "--metrics-port", "8001"]


def test_drain_stops_the_router_before_the_workers_and_restarts_nothing(tmp_path):
    fleet, sup, clock, _ = _fleet(tmp_path)
    fleet.drain(drain_timeout_s=1)
    assert sup.signals == [("router", signal.SIGTERM), ("decode-0", signal.SIGTERM)]
    clock.offset += 60
    fleet.tick()
    assert len(sup.launched) == 2 and all(w.state is ChildState.STOPPING for w in fleet.watches)
