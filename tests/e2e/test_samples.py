"""Several samples of one prompt through the real service (`n`, `best_of`): the prompt is prefilled
and its KV moved once, the later samples prefill on the first one's decode worker from its prefix
cache (sharing the prompt's blocks), every sample ends with its own finish, and both doors name
each message's sample. Clients: pdserve's own over gRPC, the openai SDK over HTTP."""

from __future__ import annotations

import pytest

from tests.helpers.worker_stats import wait_no_active_blocks, worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BLOCK = 16  # the service's KV block size (the default)


def _sent(service) -> int:
    return sum(worker_stats(service["prefill"], "prefill").kv_rank_bytes)


def test_four_samples_of_a_long_prompt_move_its_kv_once_and_share_its_blocks(service, client):
    prompt = [1] + [(37 * i) % 40000 + 100 for i in range(1999)]  # 2,000 tokens, cached nowhere before
    before = _sent(service)
    samples = client.stream(token_ids=prompt, n=4, max_tokens=12, temperature=0.9, seed=11).collect_samples()
    moved = _sent(service) - before
    assert len(samples) == 4 and all(s.finish_reason == "length" and len(s.token_ids) == 12 for s in samples)
    first, *others = [s.usage for s in samples]
    assert first.kv_transfer_bytes > 0 and not first.local_prefill
    # The prompt's KV moved once, for the first sample alone (the worker's counter may also hold a
    # canary's few blocks, router/fleet/canary.py: never a second prompt's worth).
    assert first.kv_transfer_bytes <= moved < 2 * first.kv_transfer_bytes
    for usage in others:  # prefilled beside it from its cached blocks: only the last partial block computed
        assert usage.local_prefill and usage.kv_transfer_bytes == 0
        assert usage.cached_tokens >= len(prompt) - BLOCK
    assert len({s.text for s in samples}) > 1  # each its own seed
    wait_no_active_blocks({"prefill": service["prefill"], "decode": service["decode"]})


def test_the_sdk_gets_one_choice_per_sample_whole_and_streamed(sdk, model):
    ask = [{"role": "user", "content": "Name a colour."}]
    reply = sdk.chat.completions.create(model=model, messages=ask, n=3, max_tokens=8, temperature=1.0, seed=3)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in reply.choices)
    assert reply.usage.completion_tokens >= 3
    finished, texts = {}, {}
    for chunk in sdk.chat.completions.create(model=model, messages=ask, n=2, max_tokens=8, temperature=1.0,
                                             stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert sorted(finished) == [0, 1] and all(texts.values())


def test_best_of_returns_the_n_likeliest_without_logprobs_unless_asked(sdk, model):
    reply = sdk.completions.create(model=model, prompt="The three primary colours are", n=2, best_of=4,
                                   max_tokens=6, temperature=1.0)
    assert [c.index for c in reply.choices] == [0, 1] and all(c.logprobs is None for c in reply.choices)
    scored = sdk.completions.create(model=model, prompt="The three primary colours are", n=2, best_of=4,
                                    max_tokens=6, temperature=1.0, logprobs=0)
    totals = [sum(c.logprobs.token_logprobs) for c in scored.choices]
    assert totals == sorted(totals, reverse=True)  # best first


def test_bad_sample_counts_are_refused(sdk, model, client):
    import openai

    from pdserve.client import PdserveError

    with pytest.raises(openai.BadRequestError, match="best_of"):
        sdk.completions.create(model=model, prompt="Hi", n=3, best_of=2, max_tokens=2)
    with pytest.raises(PdserveError, match="n must be in"):
        client.generate("Hi", n=17, max_tokens=2)


def test_a_cancelled_or_aborted_request_ends_every_sample_and_frees_its_blocks(service, client):
    stream = client.stream("Tell me a long story about a lighthouse.", n=3, max_tokens=400, temperature=0.9,
                           ignore_eos=True)
    next(stream)
    stream.cancel()
    wait_no_active_blocks({"prefill": service["prefill"], "decode": service["decode"]})
    stream = client.stream("Tell me a long story about a harbour.", n=3, max_tokens=400, temperature=0.9,
                           ignore_eos=True, request_id="samples-aborted")
    next(stream)
    assert client.abort("samples-aborted")
    ends = {c.index: c.finish_reason for c in stream if c.finish_reason}
    assert ends == {0: "abort", 1: "abort", 2: "abort"}
    wait_no_active_blocks({"prefill": service["prefill"], "decode": service["decode"]})


def test_grpcurl_sets_n_and_reads_each_samples_index(service):
    from tests.helpers.grpcurl import grpcurl

    result = grpcurl(service["target"]).run("pdserve.v1.Generation/Generate", data={
        "text": "Hello", "n": 2, "sampling": {"max_tokens": 4, "temperature": 0.8}})
    assert result.returncode == 0, result.stderr
    ends = [m.get("index", 0) for m in result.messages() if "finish_reason" in m]  # (0 is not printed)
    assert sorted(ends) == [0, 1]
