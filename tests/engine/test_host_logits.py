"""The host logits buffer (pdserve/engine/host_logits.py): views of one buffer that grows only
when a step has more rows; through the engine, every step's logits are that buffer's, written
there by the model (float32 on the CPU) or copied there (bfloat16), and the tokens and logprobs
equal those of the model's own fresh logits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.config import CacheConfig, EngineConfig
from pdserve.engine.engine import Engine
from pdserve.engine.host_logits import HostLogits
from pdserve.model.loader import load_model
from tests.engine.driver import GREEDY, SEEDED, tiny_prompt

pytestmark = pytest.mark.timeout(300)
MODEL = "llama_gqa_llama3"


def test_a_step_takes_a_view_of_one_buffer_that_grows_only_for_more_rows():
    logits = HostLogits(vocab_size=10)
    three = logits.rows(3)
    assert three.shape == (3, 10) and three.dtype == torch.float32 and logits.capacity == 3
    assert logits.rows(2).data_ptr() == three.data_ptr() and logits.capacity == 3
    assert logits.rows(4).shape == (4, 10) and logits.capacity == 6  # twice what it held
    assert logits.rows(20).shape == (20, 10) and logits.capacity == 20
    assert logits.rows(0).shape == (0, 10)


class Recorder:
    """Where the sampler's logits of every step lie."""

    def __init__(self, sample):
        self.sample, self.pointers = sample, []

    def __call__(self, logits, *args):
        self.pointers.append(logits.data_ptr())
        return self.sample(logits, *args)


class FreshLogits(HostLogits):
    """A new tensor every step, as before the buffer."""

    def rows(self, count: int) -> torch.Tensor:
        return torch.empty(count, self.vocab_size, dtype=torch.float32)


def run(loaded, dtype: str, logits: type[HostLogits] | None = None) -> tuple[Engine, Recorder, list]:
    """Two requests (one greedy, one sampled with logprobs) to the end: the engine, where each
    step's logits lay, and every output's (request, tokens, logprobs)."""
    cache = CacheConfig(block_size=4, num_blocks=256, num_host_blocks=0)
    engine = Engine(EngineConfig(dtype=dtype, attention_backend="torch", cache=cache), loaded=loaded)
    if logits is not None:
        engine.runner.host_logits = logits(loaded.config.vocab_size)
    recorder = engine.runner.sampler.sample = Recorder(engine.runner.sampler.sample)
    vocab = loaded.config.vocab_size
    engine.add_request("a", tiny_prompt(9, vocab, 1), dataclasses.replace(GREEDY, max_tokens=6))
    engine.add_request("b", tiny_prompt(13, vocab, 2), dataclasses.replace(SEEDED, max_tokens=6, logprobs=3))
    outputs = []
    while engine.has_unfinished():
        outputs += [(o.request_id, o.new_token_ids, o.logprobs) for o in engine.step().outputs]
    return engine, recorder, outputs


@pytest.fixture(scope="module")
def bf16_loaded(tiny_model_dirs):
    return load_model(str(tiny_model_dirs[MODEL]), dtype=torch.bfloat16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_steps_logits_are_the_buffers_and_sample_as_fresh_ones(tiny_loaded, bf16_loaded, dtype):
    loaded = tiny_loaded[MODEL] if dtype == "float32" else bf16_loaded
    engine, recorder, outputs = run(loaded, dtype)
    assert len(recorder.pointers) >= 6 and set(recorder.pointers) == {engine.runner.host_logits.rows(1).data_ptr()}
    _, _, fresh = run(loaded, dtype, FreshLogits)
    assert outputs == fresh
