"""bfloat16 on CPU (weights, activations and KV pool): greedy decoding of the tiny random models
matches float32 wherever float32's choice is clear.

Tolerance: bfloat16 keeps 8 significant bits. On these models the gap between two tokens' logits
moves by at most about 0.15 between the two dtypes (measured at every position of these runs, on
float32's context), so a gap of MARGIN_TOLERANCE = 0.3 between float32's two best logits (equally:
their log-probabilities) is twice what rounding has closed, and bfloat16 must pick the same token
there. Where the gap is smaller the two may differ, and a free-running bfloat16 continuation may
leave float32's from that position on.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from pdserve.config import CacheConfig, EngineConfig
from pdserve.engine.engine import Engine
from pdserve.model.loader import load_model
from pdserve.requests import SamplingParams
from tests.engine.conftest import TINY_NAMES
from tests.engine.driver import assert_all_blocks_released, tiny_prompt

MARGIN_TOLERANCE = 0.3
NEW_TOKENS = 12
PROMPT_LENGTHS = (5, 17, 40)


def bf16_engine(loaded) -> Engine:
    cache = CacheConfig(block_size=4, num_blocks=256, num_host_blocks=0)
    return Engine(EngineConfig(dtype="bfloat16", attention_backend="torch", cache=cache), loaded=loaded)


def fp32_engine(loaded) -> Engine:
    cache = CacheConfig(block_size=4, num_blocks=256, num_host_blocks=0)
    return Engine(EngineConfig(attention_backend="torch", cache=cache), loaded=loaded)


def finish(engine: Engine) -> dict[str, list]:
    """Step until done: request id -> its outputs' (token, logprobs) in order."""
    outputs: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step().outputs:
            outputs.setdefault(out.request_id, []).extend(zip(out.new_token_ids, out.logprobs, strict=True))
    return outputs


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)


def fp32_run(loaded, prompt: Sequence[int]) -> tuple[list[int], list[float]]:
    """float32 greedy tokens and, at each, the gap between its two best logits."""
    engine = fp32_engine(loaded)
    engine.add_request("r", prompt, greedy(NEW_TOKENS))
    [(_, steps)] = finish(engine).items()
    assert engine.kv.data.dtype == torch.float32
    return [token for token, _ in steps], [lp.top[0][1] - lp.top[1][1] for _, lp in steps]


def bf16_runs(loaded, prompt: Sequence[int], fp32_tokens: list[int]) -> tuple[list[int], list[int]]:
    """bfloat16 free-running greedy tokens, and its next token after each float32 prefix
    (teacher-forced: float32's tokens so far resumed, re-prefilled in bfloat16)."""
    engine = bf16_engine(loaded)
    engine.add_request("free", prompt, greedy(NEW_TOKENS))
    for i in range(NEW_TOKENS):
        engine.add_request(f"at{i}", prompt, greedy(i + 1), output_token_ids=fp32_tokens[:i])
    outputs = finish(engine)
    assert engine.kv.data.dtype == torch.bfloat16 and loaded.model.dtype == torch.bfloat16
    assert_all_blocks_released(engine)
    free = [token for token, _ in outputs["free"]]
    return free, [outputs[f"at{i}"][-1][0] for i in range(NEW_TOKENS)]


def clear(margins: list[float]) -> list[int]:
    return [i for i, margin in enumerate(margins) if margin > MARGIN_TOLERANCE]


@pytest.fixture(scope="module")
def bf16_loaded(tiny_model_dirs):
    return {name: load_model(str(tiny_model_dirs[name]), dtype=torch.bfloat16) for name in TINY_NAMES}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", TINY_NAMES)
def test_bf16_greedy_matches_fp32_where_the_margin_is_clear(tiny_loaded, bf16_loaded, name):
    checked = 0
    for length in PROMPT_LENGTHS:
        prompt = tiny_prompt(length, tiny_loaded[name].config.vocab_size, seed=length)
        tokens, margins = fp32_run(tiny_loaded[name], prompt)
        free, forced = bf16_runs(bf16_loaded[name], prompt, tokens)
        for i in clear(margins):
            assert forced[i] == tokens[i], f"{name}, prompt of {length}: position {i}, margin {margins[i]:.3f}"
        unclear = next((i for i, margin in enumerate(margins) if margin <= MARGIN_TOLERANCE), NEW_TOKENS)
        assert free[:unclear] == tokens[:unclear], f"{name}, prompt of {length}: before position {unclear}"
        checked += len(clear(margins))
    assert checked >= NEW_TOKENS, f"{name}: only {checked} positions had a clear margin"
