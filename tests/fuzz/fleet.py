"""A real fleet for the fuzz tests (1 prefill, 1 decode, router) and the checks that it came
through: every process up and SERVING, no block active on any worker, the canary unchanged.

Each process may allocate at most MEMORY_LIMIT_BYTES (RLIMIT_DATA): an input that makes a
server allocate without bound then fails that call (MemoryError, found as INTERNAL) instead of
taking the machine's memory from every other process on it.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import dataclass, field

import grpc

from pdserve.cli.supervisor import Child, Supervisor
from pdserve.procs.health import serving, wait_serving
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc, worker_pb2_grpc
from pdserve.v1 import worker_pb2 as wpb
from tests.fuzz.rpcs import PROMPT
from tests.helpers.cluster import cluster_flags, cluster_metadata

WORKER_FLAGS = ["--threads", "1", "--kv-blocks", "128", "--host-kv-blocks", "32", "--token-budget", "256",
                "--max-chunk-tokens", "64"]
ROLES = ("router", "registry", "prefill", "decode")
MEMORY_LIMIT_BYTES = 4 << 30  # a worker of these flags uses about 1.2 GiB
HELD = ("blocks_active", "blocks_held", "blocks_reserved", "blocks_quarantined", "requests_running",
        "requests_waiting")  # WorkerStats counters that are zero on an idle worker
VIP_TOKEN = "fuzz-vip-token"  # tenant gold: every class
NORMAL_TOKEN = "fuzz-normal-token"  # tenant basic: NORMAL at most, 4 requests in flight
TENANTS = (f"{VIP_TOKEN} tenant=gold max_priority=vip\n"
           f"{NORMAL_TOKEN} tenant=basic max_priority=normal max_concurrent=4\n")
# NOTE: the canary's prompt starts with the fuzzed reservations' prompt (tests/fuzz/rpcs.py PROMPT),
# so KV that fuzzing left in a prefix cache would change its output.
CANARY = pb.GenerateRequest(token_ids=pb.TokenIds(ids=PROMPT[:18]),
                            sampling=pb.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))


@dataclass
class FuzzFleet:
    sup: Supervisor
    router: str = ""
    registry: str = ""  # the router's internal port
    prefill: str = ""
    decode: str = ""
    children: list[Child] = field(default_factory=list)
    canary_tokens: tuple[int, ...] = ()

    @property
    def internal_metadata(self) -> tuple[tuple[str, str], ...]:
        return cluster_metadata(self.sup.workdir)

    def address(self, role: str) -> str:
        """Where `role` (router, registry, prefill or decode) is served."""
        return dict(zip(ROLES, (self.router, self.registry, self.prefill, self.decode)))[role]

    @property
    def public_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {VIP_TOKEN}"),)

    def dead(self) -> list[str]:
        """Names of the children that exited, with their exit codes."""
        return [f"{c.name} (exit {c.process.returncode}, log {self.sup.log_of(c)})" for c in self.children
                if c.exited()]


def supervisor() -> Supervisor:
    return Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})


def start_fleet(sup: Supervisor) -> FuzzFleet:
    """The fleet with a cluster token on every internal call and a tenants file on the router;
    the caller stops `sup` in `finally`."""
    tenants = sup.workdir / "tenants"
    tenants.write_text(TENANTS)
    fleet = FuzzFleet(sup)
    decode = _spawn(fleet, "decode", ["decode", "--port", "0", *WORKER_FLAGS, *cluster_flags(sup.workdir)])
    prefill = _spawn(fleet, "prefill", ["prefill", "--port", "0", *WORKER_FLAGS, *cluster_flags(sup.workdir)])
    fleet.decode = f"127.0.0.1:{sup.wait_ready(decode, 240)}"
    fleet.prefill = f"127.0.0.1:{sup.wait_ready(prefill, 240)}"
    router = _spawn(fleet, "router", [
        "router", "--port", "0", "--internal-port", "0", "--prefill-workers", fleet.prefill,
        "--decode-workers", fleet.decode, "--kv-timeout", "5", "--wait-for-worker-s", "5",
        "--api-token-file", str(tenants), *cluster_flags(sup.workdir)])
    fleet.router = f"127.0.0.1:{sup.wait_ready(router, 240)}"
    fleet.registry = f"127.0.0.1:{json.loads(router.ready_file.read_text())['internal_port']}"
    wait_serving(fleet.router, 60)
    fleet.canary_tokens = canary(fleet)
    return fleet


def _spawn(fleet: FuzzFleet, name: str, argv: list[str]) -> Child:
    child = fleet.sup.spawn(name, argv)
    _bound_memory(child)
    fleet.children.append(child)
    return child


def _bound_memory(child: Child) -> None:
    resource.prlimit(child.pid, resource.RLIMIT_DATA, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def canary(fleet: FuzzFleet) -> tuple[int, ...]:
    """The canary's greedy tokens through the router."""
    with grpc.insecure_channel(fleet.router) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        responses = stub.Generate(CANARY, metadata=fleet.public_metadata, timeout=60)
        return tuple(t for r in responses for t in r.token_ids)


def leftovers(fleet: FuzzFleet) -> dict[str, dict[str, int]]:
    """What each worker's Stats say it still holds (only counters that are not zero)."""
    found = {}
    for name, address, stub_type in (("prefill", fleet.prefill, worker_pb2_grpc.PrefillWorkerStub),
                                     ("decode", fleet.decode, worker_pb2_grpc.DecodeWorkerStub)):
        with grpc.insecure_channel(address) as channel:
            stats = stub_type(channel).Stats(wpb.StatsRequest(), metadata=fleet.internal_metadata, timeout=5)
        held = {counter: getattr(stats, counter) for counter in HELD}
        found[name] = {counter: n for counter, n in held.items() if n}
    return found


def assert_came_through(fleet: FuzzFleet, settle_s: float = 15.0) -> None:
    """Every process up and SERVING, the canary's output as before, and nothing left held."""
    assert not fleet.dead(), f"processes exited: {fleet.dead()}"
    for address in (fleet.router, fleet.registry, fleet.prefill, fleet.decode):
        assert _eventually(lambda: serving(address, 5.0), settle_s), f"{address} is not SERVING"
    assert canary(fleet) == fleet.canary_tokens, "the canary's greedy output changed"
    assert _eventually(lambda: not any(leftovers(fleet).values()), settle_s), f"still held: {leftovers(fleet)}"


def _eventually(check, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def wait_back(fleet: FuzzFleet) -> None:
    """Restart every child that exited (on its port) and wait until the router serves again."""
    dead = [c for c in fleet.children if c.exited()]
    for child in dead:
        fleet.sup.respawn(child)
        _bound_memory(child)
    for child in dead:
        fleet.sup.wait_ready(child, 240)
    if dead:
        wait_serving(fleet.router, 60)
