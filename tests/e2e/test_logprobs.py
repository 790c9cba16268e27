"""Logprobs with real worker processes: the first token's from the prefill worker, the rest from
the decode worker's stream, carried into the router's flow events, equal to the in-process
engine's; a resume on a decode worker continues them without repeating any."""

from __future__ import annotations

import asyncio
import time

import pytest

from pdserve.requests import Priority, SamplingParams
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.security import Security
from pdserve.worker.events import Finished, Tokens
from router.fleet.clients import WorkerJob
from router.flow.flow import RequestFlow
from router.flow.flow_types import FlowConfig, Job, NewTokens
from router.fleet.grpc_clients import GrpcWorkerClients
from router.flow.stream import Pumped
from router.fleet.workers import WorkerPool
from tests.helpers.cluster import cluster_token_file
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

TEXT = "The capital of France is"
MAX_TOKENS = 8
K = 5
TOLERANCE = 1e-4
SAMPLING = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=K)


@pytest.fixture(scope="module")
def reference(reference_llm):
    """The prompt's ids and the in-process engine's greedy completion, with logprobs."""
    prompt = tuple(reference_llm.tokenizer.encode(TEXT))
    return prompt, reference_llm.generate([list(prompt)], SAMPLING)[0]


def _security(service) -> Security:
    return Security(cluster_token=cluster_token_file(service["sup"].workdir).read_text().strip())


async def _with_clients(service, body):
    channels = ChannelPool(_security(service))
    clients = GrpcWorkerClients(channels)
    pool = WorkerPool(clients, [service["prefill"]], [service["decode"]])
    await pool.refresh()
    try:
        return await body(pool, clients)
    finally:
        await pool.stop()
        await channels.close()


def _assert_close(got, expected) -> None:
    assert [lp.token_id for lp in got] == [lp.token_id for lp in expected]
    for mine, ref in zip(got, expected, strict=True):
        assert mine.logprob == pytest.approx(ref.logprob, abs=TOLERANCE)
        assert [t for t, _ in mine.top] == [t for t, _ in ref.top]
        assert [v for _, v in mine.top] == pytest.approx([v for _, v in ref.top], abs=TOLERANCE)


def test_flow_events_carry_logprobs_for_every_token_including_the_first(service, reference):
    prompt, expected = reference

    async def body(pool, clients):
        flow = RequestFlow(pool, clients, FlowConfig(kv_timeout_s=10.0))
        job = Job("logprobs-e2e", prompt, SAMPLING, Priority.NORMAL, deadline=time.monotonic() + 120)
        return [e async for e in flow.run(job) if isinstance(e, NewTokens)]

    events = asyncio.run(_with_clients(service, body))
    assert all(len(e.logprobs) == len(e.token_ids) for e in events)
    assert events[0].token_ids == expected.token_ids[:1], "the prefill worker's first token comes alone"
    assert tuple(t for e in events for t in e.token_ids) == expected.token_ids
    got = [lp for e in events for lp in e.logprobs]
    assert all(lp.top[0] == (lp.token_id, lp.logprob) for lp in got), "greedy: the sampled token is the maximum"
    _assert_close(got, expected.logprobs)
    wait_no_active_blocks(service)


def test_a_resume_on_a_decode_worker_continues_the_logprobs_without_repeating(service, reference):
    """What the flow does after a decode worker failed with 3 tokens out: the next decode worker
    re-prefills prompt + those tokens and streams only the tokens after them."""
    prompt, expected = reference
    done = 3

    async def body(pool, clients):
        job = WorkerJob("logprobs-resume@1.x", prompt, SAMPLING, Priority.NORMAL, 10.0,
                        expected.token_ids[:done], timeout_s=120.0)
        call = Pumped(clients.decode(service["decode"]).open(job, local_prefill=True), service["decode"])
        tokens = []
        try:
            while not isinstance(event := await call.next(), Finished):
                if isinstance(event, Tokens):
                    tokens.append(event)
        finally:
            call.close()
        return tokens

    events = asyncio.run(_with_clients(service, body))
    assert tuple(t for e in events for t in e.token_ids) == expected.token_ids[done:]
    _assert_close([lp for e in events for lp in e.logprobs], expected.logprobs[done:])
    wait_no_active_blocks(service)


def test_generate_responses_carry_one_logprobs_entry_per_token(client, reference):
    prompt, expected = reference
    chunks = list(client.stream(token_ids=list(prompt), max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                                logprobs=K))
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    got = [lp for c in chunks for lp in c.logprobs]
    assert [lp.token_id for lp in got] == list(expected.token_ids)
    assert [len(lp.top) for lp in got] == [K] * MAX_TOKENS
    assert [lp.logprob for lp in got] == pytest.approx([lp.logprob for lp in expected.logprobs], abs=TOLERANCE)


def _prompt_reference(reference_llm, prompt: list[int], k: int) -> list:
    """The in-process engine's prompt log-probabilities of `prompt`."""
    engine = reference_llm.engine
    engine.add_request("prompt-reference", prompt, SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=k))
    entries = []
    while engine.has_unfinished():
        entries += [e for o in engine.step().outputs for e in o.prompt_logprobs]
    return entries


def test_prompt_logprobs_come_once_from_whichever_worker_prefilled(service, client, sdk, model, reference_llm):
    """Over gRPC (the prefill worker computes them) and over HTTP as echo with logprobs; equal to
    the in-process engine's, one per prompt token but the first, with the first token only."""
    prompt = list(reference_llm.tokenizer.encode("Rivers run to the sea, and the sea is never full."))
    expected = _prompt_reference(reference_llm, prompt, 2)
    chunks = list(client.stream(token_ids=prompt, max_tokens=3, temperature=0, prompt_logprobs=2))
    assert [bool(c.prompt_logprobs) for c in chunks if c.token_ids][:2] == [True, False]
    given = chunks[0].prompt_logprobs
    assert [e.token_id for e in given] == prompt[1:]
    assert [e.logprob for e in given] == pytest.approx([e.logprob for e in expected], abs=TOLERANCE)
    assert [[t for t, _ in e.top] for e in given] == [[t for t, _ in e.top] for e in expected]
    text = reference_llm.tokenizer.decode(prompt)
    echoed = sdk.completions.create(model=model, prompt=text, max_tokens=3, temperature=0, echo=True, logprobs=1)
    logprobs = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith(text) and logprobs.token_logprobs[0] is None
    assert len(logprobs.tokens) == len(reference_llm.tokenizer.encode(text)) + 3
    wait_no_active_blocks({"prefill": service["prefill"], "decode": service["decode"]})
