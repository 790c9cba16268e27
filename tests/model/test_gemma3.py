"""Gemma 3 token for token as transformers computes it, on a tiny random checkpoint whose local
layers see a window of 10 tokens (tests/helpers/tiny_models.py): prompts shorter and longer than
the window, whole and in chunks smaller than it and crossing it, decodes past it; on the reference
attention and on torch-batched (its sparse products and its C decode kernel, which serves the
global layer alone); in bfloat16 (logits equal transformers' own in bfloat16); the same checkpoint
written as llama.cpp writes a gemma3 GGUF file. The real gemma-3-270m file: test_gemma3_file.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.checkpoint.model_config import Activation, Architecture, NormStyle
from pdserve.checkpoint.rope_scaling import LinearRopeScaling
from pdserve.cpu.fused_decode import fusion_problem
from pdserve.model import load_model
from pdserve.native.paged_decode import load_native_decode
from tests.helpers.paged_driver import PagedDriver
from tests.helpers.reference import hf_greedy
from tests.helpers.tiny_gguf import write_gguf
from tests.helpers.tiny_models import GEMMA3_WINDOW, tiny_gemma3
from tests.model.test_model_parity import TINY_NEW_TOKENS, TINY_RUNS, assert_last_logits_close, tiny_prompt

pytestmark = pytest.mark.timeout(600)

WINDOWS = (GEMMA3_WINDOW,) * 5 + (None, GEMMA3_WINDOW)  # transformers' default pattern over 7 layers


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny_gemma3")


@pytest.fixture(scope="module")
def reference(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ours(folder):
    return load_model(str(folder))


def backends() -> dict[str, Callable[[], AttentionBackend]]:
    native = load_native_decode().kernel
    found = {"torch": TorchAttentionBackend, "batched-sparse": lambda: BatchedTorchBackend(None)}
    if native is not None:
        found["batched-native"] = lambda: BatchedTorchBackend(native)
    return found


def assert_greedy_runs(model, reference, make_backend: Callable[[], AttentionBackend] = TorchAttentionBackend):
    """Greedy ids of TINY_RUNS' prompts (5, 33 and 100 tokens), whole and in chunks of 1, 7 and
    64, then 16 decodes, equal transformers'."""
    for length, chunks in TINY_RUNS.items():
        prompt = tiny_prompt(length, model.config.vocab_size, seed=length)
        expected = hf_greedy(reference, prompt, TINY_NEW_TOKENS)
        for chunk in chunks:
            driver = PagedDriver(model, block_size=4, shuffle_seed=length, backend=make_backend())
            assert driver.greedy(prompt, TINY_NEW_TOKENS, chunk=chunk) == expected, f"{length}, chunk {chunk}"


def test_the_config_names_each_layers_window_rope_and_the_gemma_parts(ours):
    config = ours.config
    assert config.architecture is Architecture.GEMMA3 and config.layer_windows == WINDOWS
    assert (config.rope_theta, config.rope_scaling, config.local_rope_theta) == (1e6, LinearRopeScaling(4.0), 1e4)
    assert config.attention_scale == 24**-0.5 and config.embedding_scale == 8.0
    assert (config.norm_style, config.activation) == (NormStyle.GEMMA, Activation.GELU_TANH)
    assert config.qk_norm and config.sandwich_norms and config.tie_word_embeddings
    assert config.final_logit_softcap is None


@pytest.mark.parametrize("name", sorted(backends()))
def test_greedy_equals_transformers_past_the_window(ours, reference, name):
    assert_greedy_runs(ours.model, reference, backends()[name])


def test_logits_close_to_transformers(ours, reference):
    assert_last_logits_close(ours, reference)


def test_a_mixed_pass_equals_each_sequence_alone(ours):
    """Decodes whose windows start at different positions and a chunk crossing its window, in one
    pass, give the logits each gets alone."""
    model = ours.model
    prompts = [tiny_prompt(n, ours.config.vocab_size, seed=n) for n in (23, 4, 40)]
    alone = []
    for prompt in prompts:
        driver = PagedDriver(model, block_size=4)
        seq = driver.new_sequence(prompt)
        driver.step([(seq, len(prompt) - 1)])
        alone.append(driver.step([(seq, 1)])[0])
    for make in backends().values():
        driver = PagedDriver(model, block_size=4, shuffle_seed=1, backend=make())
        seqs = [driver.new_sequence(p) for p in prompts]
        driver.step([(seqs[0], 22), (seqs[1], 3)])
        driver.step([(seqs[2], 30)])
        mixed = driver.step([(seqs[0], 1), (seqs[2], 10), (seqs[1], 1)])
        for got, expected in zip((mixed[0], mixed[2], mixed[1]), alone):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_the_fused_c_decode_step_refuses_the_layers(ours):
    assert "sliding windows" in fusion_problem(ours.model)


def test_a_gguf_file_equals_transformers_on_the_weights_it_holds(folder, tmp_path):
    """llama.cpp stores each norm's weight plus 1 (in float32) and reads the window, the pattern
    and the local rope base as this file has them; transformers is fed the weights the file holds."""
    from transformers import AutoModelForCausalLM

    path = write_gguf(tiny_gemma3(tmp_path / "gemma3_256", query_pre_attn_scalar=32), tmp_path / "gemma3.gguf")
    loaded = load_model(str(path))
    config = loaded.config
    assert config.layer_windows == WINDOWS and config.attention_scale is None and config.local_rope_theta == 1e4
    assert config.rope_scaling == LinearRopeScaling(4.0) and config.tie_word_embeddings
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gemma3_256"), dtype=torch.float32).eval()
    state = {name: (value + 1) - 1 for name, value in reference.state_dict().items() if name.endswith("norm.weight")}
    reference.load_state_dict(state, strict=False)
    held = loaded.model.state_dict()
    assert all(torch.equal(held[name.removeprefix("model.")], value) for name, value in state.items())
    assert_greedy_runs(loaded.model, reference)



def test_bfloat16_logits_equal_transformers_in_bfloat16(folder):
    """Norms scale by (1 + w) in float32 and the embedding scale is rounded to the dtype, as
    transformers does: in bfloat16 (far from float32 on this model) the logits are its own."""
    from transformers import AutoModelForCausalLM

    prompt = tiny_prompt(30, 384, seed=9)
    half = PagedDriver(load_model(str(folder), dtype=torch.bfloat16).model, block_size=4)
    got = half.step([(half.new_sequence(prompt), 30)])[0]
    reference = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    assert got.dtype == torch.bfloat16 and half.kv.data.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)
