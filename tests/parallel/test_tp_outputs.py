"""Greedy outputs of an engine whose model is split across ranks (real processes, gloo) equal
the unsplit engine's and transformers', token for token: tiny random models at TP 2,
the embedded SmolLM2 (3 KV heads) at TP 3, under forced preemption by recompute and by swap."""

from __future__ import annotations

import pytest

from pdserve.config import PreemptionConfig
from pdserve.engine.engine import Engine
from pdserve.engine.llm import LLM
from pdserve.parallel.shard import TensorParallelError
from pdserve.requests import PreemptionMode, SamplingParams
from pdserve.tokenizer import ChatMessage
from tests.engine.driver import GREEDY, Arrival, assert_all_blocks_released, run, tiny_prompt
from tests.parallel.conftest import SMOL, tp_config

pytestmark = pytest.mark.timeout(180)

LENGTHS = (5, 33, 60)
ALWAYS_SWAP = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0)
ALWAYS_RECOMPUTE = PreemptionConfig(recompute_below_tokens=10**9)


def _arrivals(vocab_size: int, starts=(0, 0, 1)) -> list[Arrival]:
    return [Arrival(f"r{n}", tiny_prompt(n, vocab_size, seed=n), at=at) for n, at in zip(LENGTHS, starts)]


def _run_engine(config, arrivals):
    engine = Engine(config)
    try:
        trace = run(engine, arrivals)
        assert_all_blocks_released(engine)
        return trace
    finally:
        engine.loaded.ranks.close()


@pytest.mark.parametrize(("name", "tp"), [("llama_gqa_llama3", 2), ("qwen2_bias", 2), ("llama_untied", 2)])
def test_split_engine_equals_whole_engine_and_transformers(tiny_model_dirs, oracle, name, tp):
    path = tiny_model_dirs[name]
    arrivals = _arrivals(384)
    whole = _run_engine(tp_config(path, 1), arrivals)
    split = _run_engine(tp_config(path, tp), arrivals)
    for a in arrivals:
        expected = oracle.greedy(name, a.prompt, GREEDY.max_tokens)
        assert whole.tokens(a.request_id) == expected, a.request_id
        assert split.tokens(a.request_id) == expected, (name, tp, a.request_id)


@pytest.mark.parametrize("preemption", [ALWAYS_SWAP, ALWAYS_RECOMPUTE], ids=["swap", "recompute"])
def test_split_engine_under_preemption_keeps_output(tiny_model_dirs, oracle, preemption):
    """20 blocks of 4 tokens hold only the longest request: preemption is forced, and with swap
    every rank copies its own heads' blocks out and back."""
    name = "llama_gqa_llama3"
    arrivals = [Arrival(f"r{n}", tiny_prompt(n, 384, seed=n), at=at) for n, at in ((60, 0), (47, 0), (33, 0), (21, 4))]
    config = tp_config(tiny_model_dirs[name], 2, num_blocks=20, num_host_blocks=64, preemption=preemption)
    trace = _run_engine(config, arrivals)
    mode = PreemptionMode.SWAP if preemption is ALWAYS_SWAP else PreemptionMode.RECOMPUTE
    assert trace.preemptions and trace.modes() == {mode}
    for a in arrivals:
        assert trace.tokens(a.request_id) == oracle.greedy(name, a.prompt, GREEDY.max_tokens), a.request_id


def test_a_size_that_does_not_divide_the_kv_heads_fails_before_any_rank_starts(tiny_model_dirs):
    with pytest.raises(TensorParallelError, match="size 2 must divide mistral's 1 KV heads"):
        Engine(tp_config(tiny_model_dirs["mistral"], 2))
    with pytest.raises(TensorParallelError, match=r"size 2 must divide .*3 KV heads \(and its 9 attention heads\); "
                                                  r"sizes that do: 1, 3"):
        Engine(tp_config(None, 2))


@pytest.mark.timeout(300)
def test_embedded_smollm2_at_tp3_equals_transformers(oracle, smol_tokenizer):
    questions = ("Hi!", "What is the capital of France?")
    prompts = [smol_tokenizer.apply_chat_template([ChatMessage("user", q)]) for q in questions]
    sampling = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(tp_config(None, 3, block_size=16, num_blocks=16, max_chunk_tokens=32), smol_tokenizer) as llm:
        completions = llm.generate(prompts, sampling)
    for prompt, completion in zip(prompts, completions):
        assert list(completion.token_ids) == oracle.greedy(SMOL, prompt, 6)
