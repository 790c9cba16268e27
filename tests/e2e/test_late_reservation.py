"""Decode blocks reserved when the prefill starts, end to end (the router's default `--reserve-at
prefill`): a request whose decode worker has no room keeps its prompt's KV on the prefill worker
that computed it, holding no decode block, until the decode worker reserves; that prefill worker
SIGKILLed or SIGSTOPped while it holds the KV loses nothing, and every worker ends holding nothing.

Built so the hold lasts by construction: a long stream's 400-token prompt takes 25 of the decode
worker's 34 blocks (of 16 tokens) until it ends, and the second request's 200-token prompt needs 13.
The workers serve a tiny random model, each step paced to about the embedded model's pace here
(tests/helpers/pacing.py), so the filler decodes for seconds while the workers spend almost no CPU."""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from pdserve.v1 import worker_pb2 as wpb
from tests.helpers.cluster import cluster_flags
from tests.helpers.pacing import allow_pacing, pace_all, tiny_model
from tests.helpers.tiny_models import VOCAB_SIZE
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

ENGINE = ["--threads", "1", "--host-kv-blocks", "0", "--token-budget", "256", "--max-chunk-tokens", "64"]
ROLES = {"prefill-0": "prefill", "prefill-1": "prefill", "decode-0": "decode"}
FILLER_PROMPT, LONG = 400, 100  # the filler: 25 blocks at first, 32 at its end, of the decode worker's 34
HELD_PROMPT = 200  # 13 blocks: more than the filler ever leaves free


class Fleet:
    def __init__(self, sup: Supervisor, model: str):
        self.sup = sup
        allow_pacing(sup)
        secured = cluster_flags(sup.workdir)
        self.children = {n: sup.spawn(n, [role, "--port", "0", *ENGINE, "--model", model, "--kv-blocks",
                                          "34" if role == "decode" else "256", *secured])
                         for n, role in ROLES.items()}
        pace_all(sup, self.children.values())
        self.ports = {n: sup.wait_ready(c, 240) for n, c in self.children.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--model", model, "--kv-timeout", "10",
                                      "--reserve-at", "prefill",
                                      "--prefill-workers", ",".join(self.address(n) for n in ("prefill-0", "prefill-1")),
                                      "--decode-workers", self.address("decode-0"), *secured])
        self.target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(self.target, 60)

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    def stats(self, name: str) -> wpb.WorkerStats:
        return worker_stats(self.address(name), ROLES[name])

    def holding(self) -> str | None:
        """The prefill worker holding a started prompt's KV for a reservation not come yet."""
        for name in ("prefill-0", "prefill-1"):
            if self.children[name].process.poll() is None and self.stats(name).requests_awaiting_target:
                return name
        return None


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory, "late")


@pytest.fixture()
def fleet(model):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    try:
        yield Fleet(sup, model)
    finally:
        sup.stop()


def _decoding(stats: wpb.WorkerStats) -> bool:
    """One request decodes there, its KV all in (nothing reserved for a prefill any more)."""
    return stats.requests_running == 1 and stats.blocks_reserved == 0


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB_SIZE) for _ in range(n)]  # no special token


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_prefill_worker_lost_while_it_holds_a_prompts_kv_loses_nothing(fleet, fault):
    client = Client(fleet.target, ClientOptions(timeout_s=240))
    greedy = {"temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        filler = pool.submit(client.generate, token_ids=_ids(1, FILLER_PROMPT), max_tokens=LONG, **greedy)
        wait_until(lambda: _decoding(fleet.stats("decode-0")) or filler.done(), 120, "the filler decoding")
        waiting = pool.submit(client.generate, token_ids=_ids(2, HELD_PROMPT), max_tokens=16, **greedy)
        seen: list[str | None] = []
        wait_until(lambda: seen.append(fleet.holding()) or seen[-1] or filler.done(), 120,
                   "a prefill worker holding the second prompt")
        holder = seen[-1]
        assert holder is not None, "the filler ended before the second prompt was held: the construction broke"
        process = fleet.children[holder].process
        os.kill(process.pid, fault)
        try:
            results = [filler.result(240), waiting.result(240)]
        finally:
            if fault == signal.SIGSTOP:
                os.kill(process.pid, signal.SIGCONT)
    assert [len(r.token_ids) for r in results] == [LONG, 16]
    alive = [n for n, c in fleet.children.items() if c.process.poll() is None]
    wait_until(lambda: not any(fleet.stats(n).blocks_active or fleet.stats(n).blocks_held for n in alive), 60,
               "every worker left holding nothing")
    assert not any(fleet.stats(n).requests_awaiting_target for n in alive if ROLES[n] == "prefill")
