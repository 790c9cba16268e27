"""Leases on the workers, end to end: client deadlines that cut requests anywhere in their life
leave nothing held on any worker, and a request whose first token ends it finishes."""

from __future__ import annotations

import concurrent.futures
import random
import time

import pytest

from pdserve.client import Client, PdserveError
from pdserve.v1 import worker_pb2 as wpb
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REQUESTS = 50
PROMPT_TOKENS = 1500


def _prompt(seed: int) -> dict:
    rng = random.Random(seed)
    ids = [rng.randrange(300, 40_000) for _ in range(PROMPT_TOKENS)]
    return {"token_ids": ids, "max_tokens": 8, "temperature": 0, "ignore_eos": True}


def _status(client: Client, request: dict, timeout_s: float) -> str | int:
    """The status a deadline cut the request with, or the tokens it got (one that beat its deadline)."""
    try:
        return len(client.generate(**request, timeout_s=timeout_s).token_ids)
    except PdserveError as err:
        return err.code


def _held(stats: wpb.WorkerStats) -> tuple[int, int, int, int]:
    return stats.blocks_active, stats.blocks_held, stats.blocks_reserved, stats.blocks_quarantined


def _wait_all_free(service, timeout_s: float) -> dict[str, tuple[int, int, int, int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        held = {role: _held(worker_stats(service[role], role)) for role in ("decode", "prefill")}
        if all(h == (0, 0, 0, 0) for h in held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def test_random_client_deadlines_leave_every_worker_with_nothing_held(service, client):
    rng = random.Random(11)
    deadlines = [rng.uniform(0.001, 0.5) for _ in range(REQUESTS)]
    requests = [_prompt(i) for i in range(REQUESTS)]
    with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
        codes = list(pool.map(lambda pair: _status(client, *pair), zip(requests, deadlines)))
    # where each deadline falls (before, while or after the service's work) is the machine's speed:
    # each request is cut by its deadline, or served in full before it
    assert set(codes) <= {"DEADLINE_EXCEEDED", _prompt(0)["max_tokens"]}, codes
    assert _wait_all_free(service, 30.0) == {"decode": (0, 0, 0, 0), "prefill": (0, 0, 0, 0)}
    assert len(client.generate(**_prompt(999)).token_ids) == 8  # the service answers as before


def test_max_tokens_1_finishes_with_length(service, client):
    result = client.generate("The capital of France is", max_tokens=1, temperature=0, ignore_eos=True, timeout_s=30)
    assert result.finish_reason == "length" and len(result.token_ids) == 1
    assert _wait_all_free(service, 30.0) == {"decode": (0, 0, 0, 0), "prefill": (0, 0, 0, 0)}
