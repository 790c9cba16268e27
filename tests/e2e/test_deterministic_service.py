"""Deterministic mode through the service (`--deterministic` on every worker): 48 held-out
requests, half greedy and half seeded, each asking for its tokens' log-probabilities, come out
bitwise as each did alone in an in-process engine: all together on a disaggregated fleet (1
prefill + 2 decode workers), on a colocated one, and with a decode worker SIGKILLed while they
stream (its requests resume through the prefill worker onto the other one)."""

from __future__ import annotations

import concurrent.futures
import os
import signal

import pytest
import torch

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, Completion
from pdserve.config import EngineConfig
from pdserve.engine.engine import Engine
from pdserve.procs.health import wait_serving
from pdserve.requests import SamplingParams
from tests.engine.exact_runs import Ask, drive
from tests.helpers.cluster import cluster_flags
from tests.helpers.outcomes import outcome, succeeded
from tests.helpers.tiny_models import VOCAB_SIZE
from tests.helpers.waiting import wait_for
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(900)]

REQUESTS = 48
NEW_TOKENS = 24
HELD_TOKENS = 240  # the kill run's streams: still decoding when a worker is seen running several, at any speed
KILL_REQUESTS = 24  # the kill run's: the first two dozen prompts, over the two decode workers
WORKER_FLAGS = ["--threads", "1", "--kv-blocks", "256", "--host-kv-blocks", "64", "--token-budget", "256",
                "--max-chunk-tokens", "32", "--deterministic"]


def held_out_prompts(vocab: int) -> list[list[int]]:
    """Prompts of 4-90 ids from seeds no other test draws from (some sharing a prefix)."""
    prompts: list[list[int]] = []
    for i in range(REQUESTS):
        ids = torch.randint(3, vocab, (4 + (i * 29) % 87,), generator=torch.Generator().manual_seed(7000 + i)).tolist()
        prompts.append(prompts[-1][:20] + ids if i % 6 == 5 else ids)
    return prompts


def sampling(i: int, max_tokens: int) -> dict:
    seeded = {"temperature": 0.8, "seed": 9000 + i} if i % 2 else {"temperature": 0}
    return {"max_tokens": max_tokens, "ignore_eos": True, "logprobs": 3, **seeded}


def fingerprint(completion: Completion) -> tuple:
    return tuple((lp.token_id, lp.logprob, tuple(lp.top)) for lp in completion.logprobs)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.helpers.tiny_models import tiny_llama_gqa_llama3

    return tiny_llama_gqa_llama3(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return held_out_prompts(VOCAB_SIZE)


def alone_outputs(tiny, prompts: list[list[int]], max_tokens: int) -> list[tuple]:
    """Each request alone in an in-process deterministic engine of the workers' block size."""
    engine = Engine(EngineConfig(model=str(tiny), deterministic=True))
    outputs = []
    for i, prompt in enumerate(prompts):
        params = sampling(i, max_tokens)
        ask = Ask(f"a{i}", prompt, SamplingParams(**params))
        outputs.append(drive(engine, [ask]).output(ask.request_id))
    return outputs


@pytest.fixture(scope="module")
def alone(tiny, prompts) -> list[tuple]:
    return alone_outputs(tiny, prompts, NEW_TOKENS)


def start_fleet(tiny, decode: int, colocated: bool):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    names = [*([] if colocated else ["prefill-0"]), *(f"decode-{i}" for i in range(decode))]
    children = [sup.spawn(n, [n.split("-")[0], "--port", "0", "--model", str(tiny), *WORKER_FLAGS, *secured])
                for n in names]
    ports = [sup.wait_ready(c, 300) for c in children]
    decodes = ",".join(f"127.0.0.1:{p}" for p in ports[0 if colocated else 1:])
    roles = ["--colocated"] if colocated else ["--prefill-workers", f"127.0.0.1:{ports[0]}"]
    router = sup.spawn("router", ["router", "--port", "0", "--model", str(tiny), *roles, "--decode-workers", decodes,
                                  *secured])
    target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
    wait_serving(target, 60)
    return sup, target, dict(zip(names, children))


def all_together(target: str, prompts: list[list[int]], max_tokens: int, during=None) -> list[tuple]:
    """Every request at once; `during` runs once they are sent."""
    with Client(target, ClientOptions(timeout_s=600)) as client:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(outcome, client.generate, token_ids=p, **sampling(i, max_tokens))
                       for i, p in enumerate(prompts)]
            if during is not None:
                during()
            return [fingerprint(r) for r in succeeded([f.result() for f in futures])]


@pytest.fixture(scope="module")
def disaggregated(tiny):
    sup, target, children = start_fleet(tiny, decode=2, colocated=False)
    try:
        yield target, children
    finally:
        sup.stop()


def test_all_together_on_a_disaggregated_fleet(disaggregated, prompts, alone):
    target, _ = disaggregated
    assert all_together(target, prompts, NEW_TOKENS) == alone


def test_all_together_on_a_colocated_fleet(tiny, prompts, alone):
    sup, target, _ = start_fleet(tiny, decode=1, colocated=True)
    try:
        assert all_together(target, prompts, NEW_TOKENS) == alone
    finally:
        sup.stop()


def test_a_decode_worker_killed_while_they_stream(disaggregated, tiny, prompts):
    """The victim is whichever decode worker is first seen running several of the streams (each
    HELD_TOKENS long, so none is near its end then); its streams resume on the other."""
    target, children = disaggregated
    decodes = [(name, child) for name, child in children.items() if name.startswith("decode")]
    seen: list[int] = []

    def kill_a_busy_one() -> None:
        def busy():
            for name, child in decodes:
                running = worker_stats(f"127.0.0.1:{child.port}", "decode").requests_running
                if running >= 2:
                    return child, running
            return None

        victim, running = wait_for(busy, 300, "a decode worker running two of the streams")
        seen.append(running)
        os.killpg(victim.process.pid, signal.SIGKILL)

    found = all_together(target, prompts[:KILL_REQUESTS], HELD_TOKENS, during=kill_a_busy_one)
    assert seen and seen[0] >= 2
    assert found == alone_outputs(tiny, prompts[:KILL_REQUESTS], HELD_TOKENS)
