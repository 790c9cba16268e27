"""A decode worker drained (SIGTERM) mid-stream: the streams it decodes move, KV and all, to the
other decode worker and go on there (not prefilled again); the outputs equal the reference's,
the drained worker exits at once, and every worker left holds no block. The streams are under a
JSON schema, so the worker they move to rebuilds each one's grammar from its tokens: their
outputs still equal the reference's, token for token.

Fleet: one prefill worker, decode workers D0 and D1, a router with its metrics exported, on a tiny
random model, each step paced to about the embedded model's pace here (tests/helpers/pacing.py)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal

import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.client.results import Collector, now
from pdserve.procs.health import wait_serving
from pdserve.requests import Constraint, ConstraintKind
from tests.helpers.cluster import cluster_flags
from tests.helpers.metrics import counters
from tests.helpers.outcomes import outcome
from tests.helpers.pacing import allow_pacing, engine_outputs, pace_all, tiny_model
from tests.helpers.waiting import wait_for
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(900)]

ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
PROMPTS = [f"Tell the story of the clockmaker of Vell, chapter {i}." for i in range(4)]
# Long: still decoding when the drain starts (a hundred numbers cannot end within 192 tokens, so none ends early).
NUMBERS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 100}
GREEDY = {"max_tokens": 192, "temperature": 0, "constraint": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(NUMBERS))}




@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory, "departures")


@pytest.fixture(scope="module")
def reference(model):
    from pdserve.requests import SamplingParams

    return engine_outputs(model, PROMPTS, SamplingParams(**GREEDY))


def _departures(router) -> dict[str, float]:
    return counters(router.metrics_port, "pdserve_departures", "outcome")


def _read(client: Client, prompt: str):
    collector = Collector(now())
    for chunk in client.stream(prompt, **GREEDY):
        collector.add(chunk, now())
    return collector.completion


def test_a_drained_decode_worker_moves_its_streams_with_their_kv(model, reference):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    allow_pacing(sup)
    try:
        secured = cluster_flags(sup.workdir)
        names = ("prefill-0", "decode-0", "decode-1")
        children = {n: sup.spawn(n, [n.split("-")[0], "--port", "0", *ENGINE, "--model", model, *secured,
                                     "--drain-timeout-s", "60"])
                    for n in names}
        pace_all(sup, children.values())
        address = {n: f"127.0.0.1:{sup.wait_ready(c, 240)}" for n, c in children.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--model", model, "--prefill-workers",
                                      address["prefill-0"],
                                      "--decode-workers", f"{address['decode-0']},{address['decode-1']}",
                                      "--metrics-port", "0", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        with Client(target, ClientOptions(timeout_s=400)) as client:
            with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
                futures = [pool.submit(outcome, _read, client, p) for p in PROMPTS]
                victim = wait_for(lambda: next((n for n in ("decode-0", "decode-1")
                                                if worker_stats(address[n], "decode").requests_running > 0), None),
                                  120, "a decode worker decoding a stream")
                os.killpg(children[victim].process.pid, signal.SIGTERM)
                results = [f.result() for f in futures]
                drained = children[victim].process.wait(60)
        assert [tuple(r.token_ids) for r in results] == reference
        assert drained == 0
        moved = _departures(router)
        assert moved.get("kv_moved", 0) >= 1 and moved.get("prefill_again", 0) == 0
        for n in names:
            if n != victim:
                wait_for(lambda a=address[n], r=n.split("-")[0]: worker_stats(a, r).blocks_active == 0 or None, 30,
                         f"{n} holding no block")
    finally:
        sup.stop()
