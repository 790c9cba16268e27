"""The weight layout: the choice (every branch without MKL), the packed product against the dense
one at every row count, and a packed model's logits against the dense model's."""

from __future__ import annotations

import copy

import pytest
import torch

from pdserve.model.packed_weights import PackedWeight, packing_problem
from pdserve.model.weight_layout import (WeightLayoutUnavailable, apply_weight_layout, choose_weight_layout,
                                         pack_linears)

needs_packing = pytest.mark.skipif(not torch.backends.mkl.is_available(),
                                   reason="this torch build has no MKL (a CPU without it serves dense weights)")


def test_auto_packs_when_nothing_stops_it_and_stays_dense_otherwise():
    assert choose_weight_layout("auto", None) == "packed"
    assert choose_weight_layout("auto", "device cuda is not a CPU") == "dense"
    assert choose_weight_layout("dense", None) == "dense"
    assert choose_weight_layout("packed", None) == "packed"


def test_packed_where_it_cannot_run_says_why_and_what_to_use():
    with pytest.raises(WeightLayoutUnavailable, match="not a CPU; use --weight-layout dense"):
        choose_weight_layout("packed", "device cuda is not a CPU")
    with pytest.raises(ValueError, match="unknown weight layout 'blocked'"):
        choose_weight_layout("blocked", None)


def test_packing_problem_names_the_device_and_the_dtype():
    assert "not a CPU" in packing_problem("meta", torch.float32)
    assert "float32, not torch.bfloat16" in packing_problem("cpu", torch.bfloat16)


@needs_packing
def test_packing_runs_on_a_torch_with_mkl():
    """The probe's row counts compute from the panels here: a machine where they did not would
    serve dense weights, and this says so instead of skipping the packed tests."""
    assert packing_problem("cpu", torch.float32) is None


@needs_packing
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 33, 64, 100, 256, 700])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_packed_product_equals_the_dense_one(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 200, generator=gen)  # [in, out]
    bias = torch.randn(200, generator=gen) if with_bias else None
    x = torch.randn(rows, 96, generator=gen)
    dense = x @ weight if bias is None else torch.addmm(bias, x, weight)
    torch.testing.assert_close(PackedWeight.pack(weight)(x, bias), dense, rtol=1e-5, atol=1e-4)


@needs_packing
def test_a_non_contiguous_input_is_multiplied_as_its_values():
    weight = torch.randn(64, 48)
    x = torch.randn(64, 40).t()  # [40, 64], column-major
    torch.testing.assert_close(PackedWeight.pack(weight)(x, None), x.contiguous() @ weight, rtol=1e-5, atol=1e-4)


@needs_packing
@pytest.mark.parametrize("name", ["qwen2_bias", "llama_untied"])  # q/k/v biases; an untied lm_head
def test_a_packed_model_computes_the_dense_models_logits(tiny_models, name):
    from tests.model.test_model_mixed_batch import prompts, run_mixed

    model = tiny_models[name][0].model
    packed = copy.deepcopy(model)
    assert pack_linears(packed).linears == 4 * model.config.num_layers + 1  # qkv, o, gate_up, down; lm_head
    prompt_ids = prompts(model.config.vocab_size)
    ours, reference = run_mixed(packed, prompt_ids), run_mixed(model, prompt_ids)
    for key, rows in reference.items():
        torch.testing.assert_close(torch.stack(ours[key]), torch.stack(rows), rtol=1e-4, atol=1e-4)


def test_dense_asks_nothing_of_the_device():
    model = torch.nn.Linear(2, 2)
    assert apply_weight_layout(model, "dense", "meta", torch.float16) == "dense"


@needs_packing
def test_a_copied_model_packs_its_own_panels():
    model = torch.nn.Sequential()
    from pdserve.model.layers import Linear

    linear = Linear(64, 32)
    torch.nn.init.normal_(linear.weight)
    model.append(linear)
    pack_linears(model)
    twin = copy.deepcopy(model)
    assert twin[0].packed.panels is not linear.packed.panels
    assert twin[0].packed.weight is twin[0].weight  # the copy's own parameter, not a third copy
    x = torch.randn(9, 64)
    torch.testing.assert_close(twin(x), x @ linear.weight, rtol=1e-5, atol=1e-4)
