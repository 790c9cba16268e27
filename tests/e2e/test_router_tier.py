"""Two routers in front of one fleet of tiny-model workers, each complete on its own: either
serves; an Abort sent to the router not running the request ends it (for its tenant only), even one
that overtakes its Generate; with the decode worker dead, requests fail UNAVAILABLE with a retry
hint within the routers' wait and both say NOT_SERVING (gRPC health and HTTP /health) until it is
back. Every worker holds no block afterwards.

The tests share the fleet and run in order (the last one kills and restarts the decode worker)."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.procs.health import serving, wait_serving
from pdserve.procs.supervisor import Child
from tests.helpers.cluster import cluster_flags
from tests.helpers.outcomes import outcome
from tests.helpers.waiting import wait_for, wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

TENANTS = "tok-a tenant=a\ntok-b tenant=b\n"
MAX_POSITIONS = 1024
HELD_TOKENS = 1000  # a stream still running when the test acts on it, at any decode speed
KV_BLOCKS = 128  # each worker's: the held stream fits (5 + 1000 tokens in blocks of 16)
WAIT_FOR_WORKER_S = 2.0  # the routers' --wait-for-worker-s
GREEDY = {"temperature": 0, "ignore_eos": True}


@dataclass
class Tier:
    sup: Supervisor
    workers: dict[str, Child]  # by role
    routers: list[Child]

    def grpc(self, i: int) -> str:
        return f"127.0.0.1:{self.routers[i].port}"

    def client(self, i: int, tenant: str = "a", timeout_s: float = 120.0) -> Client:
        return Client(self.grpc(i), ClientOptions(token=f"tok-{tenant}", timeout_s=timeout_s))

    def http_ready(self, i: int, path: str = "/health") -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.routers[i].http_port}{path}", timeout=10) as reply:
                return reply.status == 200
        except urllib.error.HTTPError as refused:
            assert refused.code == 503, refused
            return False

    def blocks_active(self) -> dict[str, int]:
        return {role: worker_stats(f"127.0.0.1:{w.port}", role).blocks_active for role, w in self.workers.items()}


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_qwen2_bias

    tmp = tmp_path_factory.mktemp("tier")
    model = str(tiny_qwen2_bias(tmp / "qwen2", max_positions=MAX_POSITIONS))
    (tmp / "tenants").write_text(TENANTS)
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        workers = {role: sup.spawn(role, [role, "--port", "0", "--model", model, "--threads", "1", "--kv-blocks",
                                          str(KV_BLOCKS), "--host-kv-blocks", "16", "--token-budget", "256",
                                          "--max-chunk-tokens", "64", *secured])
                   for role in ("prefill", "decode")}
        addresses = {role: f"127.0.0.1:{sup.wait_ready(w, 300)}" for role, w in workers.items()}
        routers = [sup.spawn(f"router-{i}", ["router", "--port", "0", "--http-port", "0", "--model", model,
                                             "--prefill-workers", addresses["prefill"], "--decode-workers",
                                             addresses["decode"], "--api-token-file", str(tmp / "tenants"),
                                             "--wait-for-worker-s", str(WAIT_FOR_WORKER_S), *secured])
                   for i in range(2)]
        for router in routers:
            wait_serving(f"127.0.0.1:{sup.wait_ready(router, 300)}", 60)
        yield Tier(sup, workers, routers)
    finally:
        sup.stop()


def _no_blocks_held(tier: Tier) -> None:
    wait_until(lambda: set(tier.blocks_active().values()) == {0}, 30, "zero active blocks on every worker")


def test_each_router_serves_and_is_ready(tier):
    for i in range(2):
        with tier.client(i) as client:
            assert len(client.generate(token_ids=[5, 6, 7, 8], max_tokens=4, **GREEDY).token_ids) == 4
        assert tier.http_ready(i) and serving(tier.grpc(i))


def test_an_abort_sent_to_the_other_router_ends_the_stream_for_its_tenant_only(tier):
    with tier.client(0) as a, tier.client(1) as b_as_a, tier.client(1, "b") as b_as_b:
        stream = a.stream(token_ids=[9, 10, 11, 12, 13], max_tokens=HELD_TOKENS, request_id="long", **GREEDY)
        first = next(stream)  # placed: its decode worker holds it
        foreign = b_as_b.abort_outcome("long")  # tenant b's id "long": not a's request
        aborted = b_as_a.abort_outcome("long")
        rest = stream.collect()
    assert (foreign, aborted) == ("pending", "aborted")
    assert rest.finish_reason == "abort" and len(first.token_ids) + len(rest.token_ids) < HELD_TOKENS
    _no_blocks_held(tier)


def test_an_abort_that_overtakes_its_generate_to_the_other_router_ends_it_and_the_id_serves_again(tier):
    with tier.client(0) as a, tier.client(1) as b:
        assert b.abort_outcome("early") == "pending"
        first = a.generate(token_ids=[5, 6, 7, 8], max_tokens=8, request_id="early", **GREEDY)
        again = a.generate(token_ids=[5, 6, 7, 8], max_tokens=8, request_id="early", **GREEDY)
    assert first.finish_reason == "abort" and first.token_ids == []
    assert again.finish_reason == "length" and len(again.token_ids) == 8
    _no_blocks_held(tier)


def test_with_the_decode_worker_dead_requests_fail_fast_and_the_routers_are_not_ready_until_it_is_back(tier):
    decode = tier.workers["decode"]
    tier.sup.kill(decode)
    decode.process.wait(30)
    wait_until(lambda: not any(serving(tier.grpc(i)) or tier.http_ready(i) for i in range(2)), 60,
               "both routers NOT_SERVING (gRPC health and HTTP /health)")
    assert not any(tier.http_ready(i, "/ready") for i in range(2))
    assert all(tier.http_ready(i, "/live") for i in range(2))  # alive: a liveness probe must not restart them
    with ThreadPoolExecutor(2) as pool:  # a client deadline far beyond the routers' wait: theirs ends it
        failed = list(pool.map(lambda i: outcome(_generate, tier, i), range(2)))
    assert all(isinstance(f, PdserveError) and f.code == "UNAVAILABLE" and f.retry_after_s is not None
               for f in failed), failed
    tier.sup.respawn(decode)
    tier.sup.wait_ready(decode, 300)
    wait_for(lambda: all(serving(tier.grpc(i)) and tier.http_ready(i) for i in range(2)), 120,
             "both routers SERVING again")
    assert all(len(_generate(tier, i).token_ids) == 4 for i in range(2))
    _no_blocks_held(tier)


def _generate(tier: Tier, i: int):
    with tier.client(i, timeout_s=120) as client:
        return client.generate(token_ids=[5, 6, 7, 8], max_tokens=4, **GREEDY)
