"""The fused decode step (pdserve/cpu/fused_decode.py, pdserve/native/decode_layers.c): logits and the KV pool
equal to the modules' bit for bit over prefills, decode steps of 1 to 40 rows (fused) and mixed
passes (the modules), on models with GQA, q/k/v biases and an untied lm_head; the passes it leaves
to the modules (the reference backend, more rows than the panels serve); why a model does not
qualify; copies over their own weights."""

from __future__ import annotations

import copy

import pytest
import torch

from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.cpu import fused_decode
from pdserve.cpu.fused_decode import FusedDecode, fuse_decode, fusion_problem
from pdserve.cpu.layer_kernels import apply_layer_kernels
from pdserve.cpu.weight_layout import PANELS, apply_weight_layout
from tests.helpers.kernels import decode_kernel
from tests.helpers.paged_driver import PagedDriver

pytestmark = pytest.mark.timeout(300)

PROMPTS = (9, 14, 5, 21, 3, 17, 8, 6) + tuple(range(2, 34))
# each pass: (sequence index, tokens); the decode-only passes are the fused ones
SCHEDULE = [
    [(0, 9), (1, 14), (2, 5)],
    [(0, 1)],
    [(0, 1), (1, 1), (2, 1)],
    [(3, 21), (4, 3), (5, 17), (6, 8)],
    [(2, 1), (0, 1), (1, 1), (3, 1), (4, 1), (5, 1)],
    [(i, 1) for i in range(7)],
    [(6, 1), (0, 1)],
    [(1, 1), (7, 6)],  # a decode beside a prefill: the modules
    [(5, 1)],
    [(i, n) for i, n in enumerate(PROMPTS) if i >= 8],
    [(i, 1) for i in range(len(PROMPTS))],  # seven row tiles, the last of four rows
]
FUSED_PASSES = [1, 2, 4, 5, 6, 8, 10]


def served(name: str, tiny_loaded) -> torch.nn.Module:
    """A copy of the tiny model as auto serves it on a CPU: panels, native layer kernels."""
    model = copy.deepcopy(tiny_loaded[name].model)
    apply_weight_layout(model, PANELS, "cpu", torch.float32)
    assert apply_layer_kernels(model, "native", "cpu", torch.float32) == "native"
    return model


class Recorder:
    """Wraps a FusedDecode, recording for each pass whether it computed it."""

    def __init__(self, fused: FusedDecode):
        self.fused, self.served = fused, []

    def forward(self, *args) -> torch.Tensor | None:
        out = self.fused.forward(*args)
        self.served.append(out is not None)
        return out


def run(model, schedule=SCHEDULE) -> tuple[list[torch.Tensor], torch.Tensor]:
    driver = PagedDriver(model, block_size=4, backend=BatchedTorchBackend(decode_kernel()), shuffle_seed=3)
    gen = torch.Generator().manual_seed(0)
    seqs = [driver.new_sequence(torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist())
            for n in PROMPTS]
    received = []
    for step in schedule:
        work = [(seqs[i], n) for i, n in step]
        logits = driver.step(work)
        received.append(logits)
        for (seq, _), row in zip(work, logits):
            if seq.computed == len(seq.tokens):
                seq.tokens.append(int(row.argmax()))
    return received, driver.kv.data


@pytest.mark.parametrize("name", ["llama_gqa_llama3", "qwen2_bias", "llama_untied"])
def test_the_fused_step_equals_the_modules_bit_for_bit(tiny_loaded, name):
    modules = served(name, tiny_loaded)
    fused = copy.deepcopy(modules)
    assert fusion_problem(fused) is None
    fused.fused_decode = recorder = Recorder(fuse_decode(fused))
    ours, our_pool = run(fused)
    theirs, their_pool = run(modules)
    assert [i for i, hit in enumerate(recorder.served) if hit] == FUSED_PASSES
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert torch.equal(a, b), f"pass {step}"
    assert torch.equal(our_pool, their_pool)


def test_the_reference_backend_and_long_passes_run_the_modules(tiny_loaded):
    model = served("llama_gqa_llama3", tiny_loaded)
    model.fused_decode = recorder = Recorder(fuse_decode(model))
    driver = PagedDriver(model, block_size=4, backend=TorchAttentionBackend())
    seq = driver.new_sequence([5, 6, 7])
    driver.step([(seq, 3)])
    seq.tokens.append(9)
    driver.step([(seq, 1)])  # one decode, but the reference backend has no native pass
    assert recorder.served == [False, False]


def test_more_rows_than_the_panels_serve_run_the_modules(tiny_loaded, monkeypatch):
    monkeypatch.setattr(fused_decode, "PANEL_MAX_ROWS", 6)
    model = served("llama_gqa_llama3", tiny_loaded)
    model.fused_decode = recorder = Recorder(fuse_decode(model))
    run(model, SCHEDULE[:6])
    assert [i for i, hit in enumerate(recorder.served) if hit] == [1, 2, 4]  # not the pass of 7 rows


def test_a_copy_computes_from_its_own_weights(tiny_loaded):
    model = served("llama_gqa_llama3", tiny_loaded)
    fuse_decode(model)
    reference, _ = run(copy.deepcopy(model), SCHEDULE[:3])
    twin = copy.deepcopy(model)
    assert twin.fused_decode is not model.fused_decode
    assert twin.fused_decode.layers[0] is twin.layers[0]
    for linear in (m.streamed for m in model.modules() if getattr(m, "streamed", None) is not None):
        linear.panels.zero_()  # the original's panels: a twin reading them would compute zeros
    ours, _ = run(twin, SCHEDULE[:3])
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_a_model_that_does_not_qualify_says_why(tiny_loaded):
    dense = copy.deepcopy(tiny_loaded["llama_gqa_llama3"].model)
    assert "not native" in fusion_problem(dense)
    assert fuse_decode(dense) is None and dense.fused_decode is None
    apply_layer_kernels(dense, "native", "cpu", torch.float32)
    assert "not in panels" in fusion_problem(dense)
    assert fusion_problem(torch.nn.Sequential()) == "the model has no decoder layers"


def test_per_head_qk_norms_run_layer_by_layer_and_equal_transformers(tiny_loaded, tiny_model_dirs):
    """Qwen3 as auto serves it on a CPU (panels, native kernels, its q/k norms on them too): the C
    step leaves it to the modules, whose greedy ids equal transformers'."""
    from transformers import AutoModelForCausalLM

    from tests.helpers.reference import hf_greedy

    model = served("qwen3", tiny_loaded)
    assert "normalise q and k per head" in fusion_problem(model)
    assert fuse_decode(model) is None and model.layers[0].self_attn.q_norm.kernels is model.layers[0].mlp.kernels
    reference = AutoModelForCausalLM.from_pretrained(str(tiny_model_dirs["qwen3"]), dtype=torch.float32).eval()
    prompt = [1, *range(40, 80)]
    driver = PagedDriver(model, block_size=4, backend=BatchedTorchBackend(decode_kernel()))
    assert driver.greedy(prompt, 16) == hf_greedy(reference, prompt, 16)
