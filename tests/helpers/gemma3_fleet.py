"""A fleet of service processes over one tiny checkpoint (the tiny Gemma 3 of tests/e2e/test_gemma3_service.py),
with routers that each see a part of it, so a test picks its path by the router it calls:

    worker  preempted requests           routers   workers       path
    P       (prefill)                    pd        P, D0, D1     disaggregated; a decode worker killed or drained
    D0      swapped to host memory       pd0       P, D0         1P1D: preempted by swap
    D1      recomputed                   pd1       P, D1         1P1D: preempted by recompute
                                         colocated D0, D1        each decode worker prefills itself

Every worker has small KV blocks (`BLOCK_TOKENS`) and small prefill chunks (`CHUNK_TOKENS`),
neither a multiple of the other nor of the model's window. A decode worker runs `DECODE_SLOTS`
requests at once (--max-num-seqs): a request of a higher class waiting for a place preempts one.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pdserve.cli.supervisor import Child, Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from tests.helpers.cluster import cluster_flags
from tests.helpers.waiting import WaitTimeout, wait_until
from tests.helpers.worker_stats import worker_stats

BLOCK_TOKENS = 4
CHUNK_TOKENS = 7  # --max-chunk-tokens: prompts are prefilled 7 tokens a step
DECODE_BLOCKS = 256  # each decode worker's --kv-blocks: room for one request of MAX_POSITIONS alone
DECODE_SLOTS = 2  # each decode worker's --max-num-seqs
HOST_BLOCKS = DECODE_SLOTS * DECODE_BLOCKS  # D0's host pool: room for every request it runs, swapped out at once
LOCAL_PREFILL_MAX_UNCACHED = 32  # pd: a later turn's remainder up to this is prefilled on its decode worker
ROLES = {"P": "prefill", "D0": "decode", "D1": "decode"}
DECODE = ("--kv-blocks", str(DECODE_BLOCKS), "--max-num-seqs", str(DECODE_SLOTS))
WORKER_FLAGS = {"P": ("--kv-blocks", "256", "--host-kv-blocks", "16"),
                "D0": (*DECODE, "--recompute-below-tokens", "0", "--swap-above-tokens", "0",  # always swaps
                       "--host-kv-blocks", str(HOST_BLOCKS)),
                "D1": (*DECODE, "--recompute-below-tokens", "1000000", "--host-kv-blocks", "16")}  # always recomputes
ROUTERS = {"pd": ("P", "D0", "D1"), "pd0": ("P", "D0"), "pd1": ("P", "D1"), "colocated": ("D0", "D1")}


@dataclass
class Fleet:
    sup: Supervisor
    workers: dict[str, Child]  # by the names above
    routers: dict[str, Child]

    def address(self, name: str) -> str:
        child = self.workers.get(name) or self.routers[name]
        return f"127.0.0.1:{child.port}"

    @contextlib.contextmanager
    def client(self, router: str, timeout_s: float = 300.0) -> Iterator[Client]:
        with Client(self.address(router), ClientOptions(timeout_s=timeout_s)) as client:
            yield client

    def active_blocks(self) -> dict[str, int]:
        return {name: worker_stats(self.address(name), ROLES[name]).blocks_active for name in self.workers}

    def running(self, name: str) -> int:
        return worker_stats(self.address(name), ROLES[name]).requests_running

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until every worker holds no block (a request's blocks are freed once its last token is out)."""
        try:
            wait_until(lambda: not any(self.active_blocks().values()), timeout_s, "every worker holding no block")
        except WaitTimeout as timeout:
            raise WaitTimeout(f"{timeout}; still active: {self.active_blocks()}") from None

    def send(self, name: str, sig: signal.Signals) -> None:
        self.sup.kill(self.workers[name], sig)

    def restart(self, name: str, timeout_s: float = 60.0) -> None:
        """A worker that exits (killed at once after `timeout_s`) started again on its port; `wait_whole`
        waits for it."""
        child = self.workers[name]
        self.sup.wait_exit(child, timeout_s)
        self.sup.respawn(child)

    def wait_whole(self, timeout_s: float = 120.0) -> None:
        """Until every worker is ready and every router serving."""
        for child in self.workers.values():
            self.sup.wait_ready(child, timeout_s)
        for router in self.routers:
            wait_serving(self.address(router), timeout_s)


def start_fleet(model: Path, drain_timeout_s: float = 60.0) -> Fleet:
    """The fleet above; `Fleet.sup.stop()` ends it."""
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    try:
        common = ["--port", "0", "--model", str(model), "--threads", "1", "--block-size", str(BLOCK_TOKENS),
                  "--token-budget", "256", "--max-chunk-tokens", str(CHUNK_TOKENS), "--drain-timeout-s",
                  str(drain_timeout_s), *cluster_flags(sup.workdir)]
        workers = {n: sup.spawn(n, [role, *common, *WORKER_FLAGS[n]]) for n, role in ROLES.items()}
        for child in workers.values():
            sup.wait_ready(child, 300)
        routers = {name: sup.spawn(name, _router_argv(sup, model, workers, members, colocated=name == "colocated"))
                   for name, members in ROUTERS.items()}
        for child in routers.values():
            sup.wait_ready(child, 300)
        fleet = Fleet(sup, workers, routers)
        fleet.wait_whole(60)
        return fleet
    except BaseException:
        sup.stop()
        raise


def _router_argv(sup: Supervisor, model: Path, workers: dict[str, Child], members: tuple[str, ...],
                 colocated: bool) -> list[str]:
    at = lambda role: ",".join(f"127.0.0.1:{workers[n].port}" for n in members if ROLES[n] == role)  # noqa: E731
    placement = ["--colocated"] if colocated else ["--prefill-workers", at("prefill")]
    return ["router", "--port", "0", "--model", str(model), *placement, "--decode-workers", at("decode"),
            "--metrics-port", "0", "--canary-interval-s", "0", "--kv-timeout", "10",
            "--local-prefill-max-uncached", str(LOCAL_PREFILL_MAX_UNCACHED), *cluster_flags(sup.workdir)]
