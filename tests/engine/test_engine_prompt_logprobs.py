"""Prompt log-probabilities through the whole Engine: each prompt token's (but the first) equals
transformers' log-softmax at the position before it, with its top alternatives, whether the
prompt is prefilled whole or in chunks, once even when a recompute prefills it again, and never
from the prefix cache (which holds no logits); they come with the first token, once."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.config import PreemptionConfig
from tests.engine.driver import GREEDY, Arrival, assert_all_blocks_released, make_engine, run, tiny_prompt

MODEL = "llama_gqa_llama3"
ASKING = dataclasses.replace(GREEDY, max_tokens=4, prompt_logprobs=3)


def _reference(model_dir, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)  # [P, V]: row j predicts token j + 1


def _prompt_logprobs(engine, request_id: str, prompt: list[int]) -> list:
    engine.add_request(request_id, prompt, ASKING)
    given = []
    while engine.has_unfinished():
        given += [o.prompt_logprobs for o in engine.step().outputs if o.request_id == request_id and o.prompt_logprobs]
    assert len(given) == 1  # once, with the first token
    return list(given[0])


@pytest.mark.parametrize("max_chunk_tokens", [1024, 7])
def test_each_prompt_token_has_transformers_logprob_and_top(tiny_loaded, tiny_model_dirs, max_chunk_tokens):
    engine = make_engine(tiny_loaded[MODEL], max_chunk_tokens=max_chunk_tokens)
    prompt = tiny_prompt(30, engine.limits.vocab_size, seed=3)
    entries = _prompt_logprobs(engine, "p", prompt)
    reference = _reference(tiny_model_dirs[MODEL], prompt)
    assert [e.token_id for e in entries] == prompt[1:]
    for j, entry in enumerate(entries):
        assert entry.logprob == pytest.approx(reference[j, prompt[j + 1]].item(), abs=1e-4)
        top = reference[j].topk(3)
        assert [t for t, _ in entry.top] == top.indices.tolist()
    again = _prompt_logprobs(engine, "again", prompt)  # its blocks are cached now: computed anyway
    assert [e.logprob for e in again] == pytest.approx([e.logprob for e in entries], abs=1e-5)
    assert_all_blocks_released(engine)


def test_a_recompute_keeps_each_prompt_logprob_once(tiny_loaded):
    engine = make_engine(tiny_loaded[MODEL], block_size=4, num_blocks=20,
                         preemption=PreemptionConfig(recompute_below_tokens=10**9))
    vocab, asking = engine.limits.vocab_size, dataclasses.replace(ASKING, max_tokens=16)
    arrivals = [Arrival(f"r{n}", tiny_prompt(n, vocab, seed=n), asking, at=at)  # as test_engine_preemption's
                for n, at in ((60, 0), (47, 0), (33, 0), (5, 1), (21, 4))]
    trace = run(engine, arrivals)
    assert trace.preemptions  # forced: the pool holds one request at a time
    for arrival in arrivals:
        request = trace.requests[arrival.request_id]
        assert [e.token_id for e in request.prompt_logprobs] == arrival.prompt[1:]
    assert_all_blocks_released(engine)
