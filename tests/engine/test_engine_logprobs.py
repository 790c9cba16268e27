"""Logprobs through the whole Engine: one per generated token, the raw distribution's (greedy:
its maximum), equal to transformers' fp32 forward pass; preemption neither loses, repeats nor
shifts them; requests that did not ask get none."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.config import EngineConfig
from pdserve.engine.engine import Engine
from pdserve.engine.llm import LLM
from pdserve.requests import PreemptionMode, SamplingParams
from pdserve.sampling import TokenLogprobs
from pdserve.tokenizer import ChatMessage
from tests.engine.conftest import SMOL
from tests.engine.driver import GREEDY, Arrival, assert_all_blocks_released, make_engine, tiny_prompt
from tests.engine.test_engine_preemption import ALWAYS_RECOMPUTE, ALWAYS_SWAP, LENGTHS_AND_STARTS, TIGHT_BLOCKS
from tests.helpers.reference import hf_last_logits

MODEL = "llama_gqa_llama3"
K = 5
CHECKED = 4  # leading tokens compared with transformers
TOLERANCE = 1e-4
WITH_LOGPROBS = dataclasses.replace(GREEDY, max_tokens=8, logprobs=K)


def _drive(engine: Engine, arrivals: list[Arrival], max_steps: int = 2000):
    """Step to the end; per request: its streamed tokens and logprobs, and the preemption modes seen."""
    tokens: dict[str, list[int]] = {a.request_id: [] for a in arrivals}
    logprobs: dict[str, list[TokenLogprobs]] = {a.request_id: [] for a in arrivals}
    modes: set[PreemptionMode] = set()
    pending, steps = sorted(arrivals, key=lambda a: a.at), 0
    while pending or engine.has_unfinished():
        while pending and pending[0].at <= steps:
            a = pending.pop(0)
            engine.add_request(a.request_id, a.prompt, a.sampling, a.priority)
        assert steps < max_steps
        result = engine.step()
        engine.scheduler.check_integrity()
        modes |= {p.mode for p in result.preemptions}
        for out in result.outputs:
            tokens[out.request_id].extend(out.new_token_ids)
            logprobs[out.request_id].extend(out.logprobs)
        steps += 1
    return tokens, logprobs, modes


def _assert_aligned_greedy(tokens: list[int], logprobs: list[TokenLogprobs], k: int) -> None:
    assert [lp.token_id for lp in logprobs] == tokens
    for lp in logprobs:
        assert len(lp.top) == k
        assert lp.top[0] == (lp.token_id, lp.logprob), "a greedy token is the distribution's maximum"
        assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:]))


def _assert_match_transformers(hf_model, prompt: list[int], tokens: list[int], logprobs: list[TokenLogprobs]) -> None:
    for i in range(CHECKED):
        expected = torch.log_softmax(hf_last_logits(hf_model, prompt + tokens[:i]), dim=-1)
        lp = logprobs[i]
        assert lp.logprob == pytest.approx(expected[tokens[i]].item(), abs=TOLERANCE), f"token {i}"
        values, ids = expected.topk(K)
        assert [t for t, _ in lp.top] == ids.tolist(), f"token {i}"
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=TOLERANCE), f"token {i}"


@pytest.mark.timeout(300)
def test_tiny_model_greedy_logprobs_match_transformers(tiny_loaded, oracle):
    loaded = tiny_loaded[MODEL]
    prompts = {n: tiny_prompt(n, loaded.config.vocab_size, seed=n) for n in (33, 5)}
    engine = make_engine(loaded, max_chunk_tokens=16)
    arrivals = [Arrival("asks", prompts[33], WITH_LOGPROBS),
                Arrival("silent", prompts[5], dataclasses.replace(WITH_LOGPROBS, logprobs=None)),
                Arrival("sampled-only", prompts[5], dataclasses.replace(WITH_LOGPROBS, logprobs=0), at=1)]
    tokens, logprobs, _ = _drive(engine, arrivals)
    _assert_aligned_greedy(tokens["asks"], logprobs["asks"], K)
    assert tokens["asks"] == oracle.greedy(MODEL, prompts[33], WITH_LOGPROBS.max_tokens)
    _assert_match_transformers(oracle._model(MODEL), prompts[33], tokens["asks"], logprobs["asks"])
    assert logprobs["silent"] == [] and len(tokens["silent"]) == WITH_LOGPROBS.max_tokens
    assert [lp.token_id for lp in logprobs["sampled-only"]] == tokens["sampled-only"] == tokens["silent"]
    assert all(lp.top == () for lp in logprobs["sampled-only"])
    assert_all_blocks_released(engine)


@pytest.mark.timeout(420)
def test_smollm2_greedy_logprobs_match_transformers(smol_loaded, smol_tokenizer, oracle):
    prompt = smol_tokenizer.apply_chat_template([ChatMessage("user", "What is the capital of France?")])
    sampling = dataclasses.replace(WITH_LOGPROBS, max_tokens=CHECKED)
    engine = make_engine(smol_loaded, block_size=16, num_blocks=16, max_chunk_tokens=32)
    tokens, logprobs, _ = _drive(engine, [Arrival("q", prompt, sampling)])
    _assert_aligned_greedy(tokens["q"], logprobs["q"], K)
    _assert_match_transformers(oracle._model(SMOL), prompt, tokens["q"], logprobs["q"])
    assert_all_blocks_released(engine)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("preemption", [ALWAYS_RECOMPUTE, ALWAYS_SWAP], ids=["recompute", "swap"])
def test_preemption_keeps_one_logprob_per_token_with_the_same_values(tiny_loaded, preemption):
    loaded = tiny_loaded[MODEL]
    sampling = dataclasses.replace(GREEDY, logprobs=3)
    arrivals = [Arrival(f"r{n}", tiny_prompt(n, loaded.config.vocab_size, seed=n), sampling, at=at)
                for n, at in LENGTHS_AND_STARTS]
    calm_tokens, calm, _ = _drive(make_engine(loaded, max_chunk_tokens=16), arrivals)
    tight = make_engine(loaded, block_size=4, num_blocks=TIGHT_BLOCKS, num_host_blocks=64, max_chunk_tokens=16,
                        preemption=preemption)
    tokens, logprobs, modes = _drive(tight, arrivals)
    assert modes == {preemption_mode(preemption)}
    for a in arrivals:
        assert tokens[a.request_id] == calm_tokens[a.request_id]
        _assert_aligned_greedy(tokens[a.request_id], logprobs[a.request_id], 3)
        for mine, ref in zip(logprobs[a.request_id], calm[a.request_id], strict=True):
            assert mine.logprob == pytest.approx(ref.logprob, abs=TOLERANCE)
            assert [t for t, _ in mine.top] == [t for t, _ in ref.top]
    assert_all_blocks_released(tight)


def preemption_mode(config) -> PreemptionMode:
    return PreemptionMode.RECOMPUTE if config is ALWAYS_RECOMPUTE else PreemptionMode.SWAP


def test_sampled_requests_report_the_raw_distribution(tiny_loaded):
    """Seeded sampling with filters: the token drawn is one the filters kept, its logprob the
    unfiltered one (so the top alternatives need not all be drawable)."""
    loaded = tiny_loaded[MODEL]
    prompt = tiny_prompt(21, loaded.config.vocab_size, seed=21)
    sampling = SamplingParams(temperature=0.7, top_k=3, seed=11, max_tokens=6, ignore_eos=True, logprobs=K)
    tokens, logprobs, _ = _drive(make_engine(loaded), [Arrival("s", prompt, sampling)])
    assert [lp.token_id for lp in logprobs["s"]] == tokens["s"]
    for lp in logprobs["s"]:
        assert lp.token_id in [t for t, _ in lp.top[:3]], "top_k=3 keeps only the three most likely"
        assert dict(lp.top)[lp.token_id] == lp.logprob


def test_llm_generate_returns_logprobs(tiny_loaded, tiny_tokenizers):
    engine = make_engine(tiny_loaded[MODEL])
    llm = LLM(EngineConfig(), tokenizer=tiny_tokenizers[MODEL], engine=engine)
    asks, silent = llm.generate(["Hello there"], dataclasses.replace(WITH_LOGPROBS, max_tokens=5)) + \
        llm.generate(["Hello there"], dataclasses.replace(WITH_LOGPROBS, max_tokens=5, logprobs=None))
    assert [lp.token_id for lp in asks.logprobs] == list(asks.token_ids) == list(silent.token_ids)
    assert silent.logprobs == ()
