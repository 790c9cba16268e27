"""The layer kernels: the choice (every branch), each native op against the torch reference on
strided and odd shapes, the inputs the C code was not built for going to the reference, a model on
native kernels computing the reference model's logits, and a machine without a compiler keeping
the reference."""

from __future__ import annotations

import copy

import pytest
import torch

from pdserve.cpu.layer_kernels import (LayerKernelsUnavailable, NativeKernels, apply_layer_kernels,
                                       choose_layer_kernels, load_native_kernels, set_layer_kernels)
from pdserve.model.layer_kernels import TorchKernels
from tests.helpers.kernels import built

REFERENCE = TorchKernels()
CLOSE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def native() -> NativeKernels:
    return built(load_native_kernels("cpu", torch.float32), "the layer kernels")


def test_auto_takes_native_where_nothing_stops_it_and_torch_otherwise():
    assert choose_layer_kernels("auto", None) == "native"
    assert choose_layer_kernels("auto", "no compiler") == "torch"
    assert choose_layer_kernels("torch", None) == "torch"
    assert choose_layer_kernels("native", None) == "native"


def test_native_where_it_cannot_run_says_why_and_what_to_use():
    with pytest.raises(LayerKernelsUnavailable, match="float32, not torch.bfloat16; use --layer-kernels torch"):
        choose_layer_kernels("native", "they compute float32, not torch.bfloat16")
    with pytest.raises(ValueError, match="choose one of auto, native, torch"):
        choose_layer_kernels("fast", None)


def test_every_problem_names_the_device_or_the_dtype():
    assert load_native_kernels("cuda", torch.float32) == (None, "device cuda is not a CPU")
    assert load_native_kernels("cpu", torch.float16) == (None, "they compute float32, not torch.float16")


@pytest.mark.parametrize("dim", [576, 40, 3, 1])
@pytest.mark.parametrize("rows", [0, 1, 7, 64])
def test_the_norm_equals_the_reference(native, rows, dim):
    gen = torch.Generator().manual_seed(rows * 1000 + dim)
    x, weight = torch.randn(rows, dim + 5, generator=gen)[:, :dim], torch.randn(dim, generator=gen)  # strided rows
    torch.testing.assert_close(native.rms_norm(x, weight, 1e-6), REFERENCE.rms_norm(x, weight, 1e-6), **CLOSE)


@pytest.mark.parametrize("inter", [1536, 40, 1])
@pytest.mark.parametrize("rows", [0, 1, 9])
def test_the_swiglu_product_equals_the_reference(native, rows, inter):
    gen = torch.Generator().manual_seed(rows * 100 + inter)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 6  # saturating sigmoids too
    expected = REFERENCE.silu_mul(gate_up.clone())
    torch.testing.assert_close(native.silu_mul(gate_up), expected, **CLOSE)


@pytest.mark.parametrize(("heads", "head_dim"), [(12, 64), (5, 40), (3, 2)])
@pytest.mark.parametrize("rows", [1, 9])
def test_rotary_positions_equal_the_reference_in_the_projections_output(native, rows, heads, head_dim):
    gen = torch.Generator().manual_seed(rows + heads + head_dim)
    fused = torch.randn(rows, (heads + 2) * head_dim, generator=gen)  # as qkv: the rotated heads, then two more
    x = fused[:, : heads * head_dim].view(rows, heads, head_dim)
    angles = torch.randn(rows, 1, head_dim // 2, generator=gen)
    expected, untouched = REFERENCE.rope(x.clone(), angles.cos(), angles.sin()), fused[:, heads * head_dim :].clone()
    torch.testing.assert_close(native.rope(x, angles.cos(), angles.sin()), expected, **CLOSE)
    assert torch.equal(fused[:, heads * head_dim :], untouched)


def test_inputs_the_c_code_was_not_built_for_take_the_reference(native):
    x64 = torch.randn(4, 8, dtype=torch.float64)
    assert native.rms_norm(x64, torch.ones(8, dtype=torch.float64), 1e-6).dtype == torch.float64
    columns = torch.randn(8, 4).t()  # rows not contiguous
    torch.testing.assert_close(native.rms_norm(columns, torch.ones(8), 1e-6),
                               REFERENCE.rms_norm(columns, torch.ones(8), 1e-6))
    gate_up64 = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(native.silu_mul(gate_up64.clone()), REFERENCE.silu_mul(gate_up64.clone()))
    heads_apart = torch.randn(2, 4, 16)[:, ::2]  # heads not contiguous
    angles = torch.randn(2, 1, 8)
    torch.testing.assert_close(native.rope(heads_apart, angles.cos(), angles.sin()),
                               REFERENCE.rope(heads_apart, angles.cos(), angles.sin()))


def test_one_row_with_any_row_stride_runs_native(native, monkeypatch):
    """A tied model's embedding of one token is a transposed column: [1, n] with stride (1, 1)."""
    monkeypatch.setattr(native, "_reference", None)  # a fall back would fail on None
    row = torch.randn(64, 1).t().contiguous()
    assert row.stride() == (1, 1)
    weight = torch.randn(64)
    torch.testing.assert_close(native.rms_norm(row, weight, 1e-6), REFERENCE.rms_norm(row, weight, 1e-6), **CLOSE)
    gate_up = torch.randn(64, 1).t().contiguous()
    torch.testing.assert_close(native.silu_mul(gate_up.clone()), REFERENCE.silu_mul(gate_up.clone()), **CLOSE)


@pytest.mark.parametrize("name", ["qwen2_bias", "llama_untied"])
def test_a_model_on_native_kernels_computes_the_reference_logits(tiny_loaded, native, name):
    from tests.model.test_model_mixed_batch import prompts, run_mixed

    model = tiny_loaded[name].model
    fast = copy.deepcopy(model)
    assert set_layer_kernels(fast, native) == 4 * model.config.num_layers + 1  # 2 norms, attention, MLP; final norm
    prompt_ids = prompts(model.config.vocab_size)
    ours, reference = run_mixed(fast, prompt_ids), run_mixed(model, prompt_ids)
    for key, rows in reference.items():
        torch.testing.assert_close(torch.stack(ours[key]), torch.stack(rows), rtol=1e-4, atol=1e-4)
    assert copy.deepcopy(fast).norm.kernels is native  # stateless: copies share the library


def test_without_a_compiler_auto_keeps_the_reference(tiny_loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    model = copy.deepcopy(tiny_loaded["qwen2_bias"].model)
    assert apply_layer_kernels(model, "auto", "cpu", torch.float32) == "torch"
    assert all(m.kernels.name == "torch" for m in model.modules() if hasattr(m, "kernels"))
    with pytest.raises(LayerKernelsUnavailable, match="/bin/false"):
        apply_layer_kernels(model, "native", "cpu", torch.float32)


def test_torch_and_other_devices_ask_nothing_of_the_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/bin/false")
    model = torch.nn.Sequential()
    assert apply_layer_kernels(model, "torch", "cpu", torch.float32) == "torch"
    assert apply_layer_kernels(model, "auto", "meta", torch.float16) == "torch"
