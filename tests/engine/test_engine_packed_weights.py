"""What `auto` serves on a CPU through the whole Engine: packed projection weights
(`--weight-layout auto`: oneDNN's blocked weight, and the panels for products of up to 256 rows),
the native layer kernels (`--layer-kernels native`: norms, SwiGLU, rotary positions in C), and
decode steps through every layer in one C call. Greedy tokens equal to the reference model's
(dense, torch ops) and to transformers', at batch 1, 64 and 256, with mixed context lengths and
prefix-cache hits, under both CPU attention backends. MKL's panels are held to the dense model's
logits in tests/cpu/test_weight_layout.py, the panels in tests/cpu/test_panel_weights.py, the
native kernels to torch's in tests/cpu/test_layer_kernels.py."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from pdserve.cpu.fused_decode import fuse_decode
from pdserve.cpu.layer_kernels import apply_layer_kernels
from pdserve.cpu.onednn_weights import OneDnnWeight
from pdserve.cpu.panel_weights import load_row_panels
from pdserve.cpu.weight_layout import pack_linears, stream_linears
from tests.cpu.test_weight_layout import needs_onednn
from tests.engine.test_engine_batched_attention import (assert_big_batch_equal,
                                                       assert_smollm2_alone_and_mixed_equal_transformers, run_batch,
                                                       shared_prefix_prompts)

pytestmark = needs_onednn


def packed(loaded):
    """A copy of `loaded` as auto serves it on a CPU: every projection packed for oneDNN and in
    panels, the small ops on the native kernels, few-row decode steps fused (the session's models
    stay the reference)."""
    model = copy.deepcopy(loaded.model)
    pack_linears(model, OneDnnWeight)
    panels, problem = load_row_panels("cpu", torch.float32)
    assert panels is not None, problem
    stream_linears(model, panels)
    assert apply_layer_kernels(model, "native", "cpu", torch.float32) == "native"
    assert fuse_decode(model) is not None  # decode steps in one C call
    return dataclasses.replace(loaded, model=model)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("name", "count", "backend"), [("llama_gqa_llama3", 64, "torch"),
                                                        ("qwen2_bias", 64, "torch-batched"),
                                                        ("llama_untied", 256, "torch-batched")])
def test_big_batches_equal_the_reference_model_and_transformers(tiny_loaded, oracle, name, count, backend):
    loaded = tiny_loaded[name]
    prompts = shared_prefix_prompts(count, loaded.config.vocab_size, seed=count + 1)
    ours = run_batch(packed(loaded), backend, prompts)
    assert_big_batch_equal(ours, run_batch(loaded, backend, prompts), "dense model", oracle, name, prompts)


@pytest.mark.timeout(600)
def test_smollm2_batch_one_and_a_mixed_batch_equal_transformers(smol_loaded, smol_tokenizer, oracle):
    assert_smollm2_alone_and_mixed_equal_transformers(packed(smol_loaded), smol_tokenizer, oracle, "torch",
                                                      "torch-batched")
