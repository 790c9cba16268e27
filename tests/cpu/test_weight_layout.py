"""The weight layout: the choice (every branch, whatever this torch has), each packing's product
against the dense one at every row count, and a packed model's logits against the dense model's."""

from __future__ import annotations

import copy

import pytest
import torch

from pdserve.cpu.mkl_weights import MklPanels
from pdserve.cpu.onednn_weights import OneDnnWeight
from pdserve.cpu.product_probe import HEAD_ROWS
from pdserve.cpu.weight_layout import (PACKINGS, PANELS, WeightLayout, WeightLayoutUnavailable,
                                       apply_weight_layout, choose_weight_layout, pack_linears, packing_problems)
from pdserve.model.layers import Linear

needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(),
                               reason="this torch build has no MKL (a CPU without it packs for oneDNN or not at all)")
needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),
    reason="this torch build has no oneDNN (a CPU without it packs for MKL or not at all)")
packings = pytest.mark.parametrize("packing", [pytest.param(MklPanels, marks=needs_mkl, id="mkl"),
                                               pytest.param(OneDnnWeight, marks=needs_onednn, id="onednn")])

NOT_CPU = "device cuda is not a CPU"


def test_auto_takes_the_first_packing_nothing_stops_and_stays_dense_otherwise():
    assert choose_weight_layout("auto", {"onednn": None, "mkl": None, PANELS: None}) == WeightLayout("onednn", PANELS)
    no_onednn = {"onednn": "this torch build has no oneDNN", "mkl": None, PANELS: None}
    assert choose_weight_layout("auto", no_onednn) == WeightLayout("mkl", PANELS)
    assert choose_weight_layout("auto", {"onednn": NOT_CPU, "mkl": NOT_CPU, PANELS: NOT_CPU}) == WeightLayout("dense")
    assert choose_weight_layout("dense", {"onednn": NOT_CPU, "mkl": NOT_CPU}) == WeightLayout("dense")
    assert choose_weight_layout("mkl", {"onednn": NOT_CPU, "mkl": None, PANELS: None}) == WeightLayout("mkl")


def test_auto_reads_decode_rows_from_panels_only_where_they_build():
    no_compiler = "no C compiler on this machine"
    assert choose_weight_layout("auto", {"onednn": None, "mkl": None, PANELS: no_compiler}) == WeightLayout("onednn")
    assert choose_weight_layout(PANELS, {PANELS: None}) == WeightLayout("dense", PANELS)
    with pytest.raises(WeightLayoutUnavailable, match=f"panels weights unavailable: {no_compiler}; use"):
        choose_weight_layout(PANELS, {PANELS: no_compiler})
    assert str(WeightLayout("onednn", PANELS)) == "panels up to 256 rows, onednn beyond"
    assert str(WeightLayout("mkl")) == "mkl"


def test_a_packing_where_it_cannot_run_says_why_and_what_to_use():
    unavailable = "onednn weights unavailable: .*not a CPU; use --weight-layout dense"
    with pytest.raises(WeightLayoutUnavailable, match=unavailable):
        choose_weight_layout("onednn", {"onednn": NOT_CPU, "mkl": None})
    unknown = "unknown weight layout 'packed'; choose one of auto, onednn, mkl, panels, dense"
    with pytest.raises(ValueError, match=unknown):
        choose_weight_layout("packed", {})


@pytest.mark.parametrize("packing", list(PACKINGS.values()), ids=list(PACKINGS))
def test_every_packing_names_the_device_and_the_dtype(packing):
    assert "not a CPU" in packing.problem("meta", torch.float32)
    assert "float32, not torch.bfloat16" in packing.problem("cpu", torch.bfloat16)


@packings
def test_the_packing_runs_on_a_torch_with_its_library(packing):
    """The probe's row counts compute from the packed weight here: a machine where they did not
    would serve another layout, and this says so instead of skipping the packed tests."""
    assert packing.problem("cpu", torch.float32) is None


@needs_onednn
def test_auto_lays_a_cpu_float32_model_out_for_onednn():
    assert packing_problems("cpu", torch.float32)["onednn"] is None
    assert apply_weight_layout(torch.nn.Sequential(), "auto", "cpu", torch.float32) == WeightLayout("onednn", PANELS)


class HeadedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Linear(32, 48), Linear(48, 32)])
        self.lm_head = Linear(32, 500)


def test_auto_measures_the_head_on_its_own_shape_and_routes_it_so(monkeypatch):
    monkeypatch.setenv("PDSERVE_KEEP_MEASUREMENTS", "0")
    model = HeadedModel()
    for m in model.modules():
        if isinstance(m, Linear):
            torch.nn.init.normal_(m.weight)
    layout = apply_weight_layout(model, "auto", "cpu", torch.float32)
    if layout.rates is None:
        pytest.skip("nothing but dense to measure on this torch")
    assert layout.head_rates.rows == HEAD_ROWS and layout.head_route is not None
    assert "dense" in layout.head_rates.seconds  # and only the copies the head holds:
    assert set(layout.head_rates.seconds) <= {"dense", PANELS, layout.many_rows}
    assert model.lm_head.route == layout.head_route
    assert all(m.route == layout.route for m in model.layers)
    x = torch.randn(5, 32)
    torch.testing.assert_close(model.lm_head(x), x @ model.lm_head.weight, rtol=1e-5, atol=1e-5)


@packings
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 33, 64, 100, 256, 700])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_packed_product_equals_the_dense_one(packing, rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 200, generator=gen)  # [in, out]
    bias = torch.randn(200, generator=gen) if with_bias else None
    x = torch.randn(rows, 96, generator=gen)
    dense = x @ weight if bias is None else torch.addmm(bias, x, weight)
    torch.testing.assert_close(packing.pack(weight)(x, bias), dense, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("layout", ["dense", "packed", PANELS])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_linear_writes_its_product_into_the_buffer_given(layout, with_bias):
    from pdserve.model.layers import Linear
    from pdserve.cpu.panel_weights import load_row_panels

    linear = Linear(64, 80, bias=with_bias)
    for p in linear.parameters():
        torch.nn.init.normal_(p)
    if layout == "packed":
        problem = OneDnnWeight.problem("cpu", torch.float32)
        if problem:
            pytest.skip(problem)
        linear.packed = OneDnnWeight.pack(linear.weight)
    elif layout == PANELS:
        panels, problem = load_row_panels("cpu", torch.float32)
        if panels is None:
            pytest.skip(problem)
        linear.streamed = panels.pack(linear.weight)
    x, out = torch.randn(7, 64), torch.full((7, 80), float("nan"))
    expected = x @ linear.weight + (linear.bias if with_bias else 0)
    with torch.inference_mode():  # as the model's forward runs
        assert linear(x, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(linear(x), expected, rtol=1e-5, atol=1e-4)


@packings
def test_a_non_contiguous_input_is_multiplied_as_its_values(packing):
    weight = torch.randn(64, 48)
    x = torch.randn(64, 40).t()  # [40, 64], column-major
    torch.testing.assert_close(packing.pack(weight)(x, None), x.contiguous() @ weight, rtol=1e-5, atol=1e-4)


@packings
@pytest.mark.parametrize("name", ["qwen2_bias", "llama_untied"])  # q/k/v biases; an untied lm_head
def test_a_packed_model_computes_the_dense_models_logits(tiny_loaded, packing, name):
    from tests.model.test_model_mixed_batch import prompts, run_mixed

    model = tiny_loaded[name].model
    packed = copy.deepcopy(model)
    assert pack_linears(packed, packing).linears == 4 * model.config.num_layers + 1  # qkv, o, gate_up, down; lm_head
    prompt_ids = prompts(model.config.vocab_size)
    ours, reference = run_mixed(packed, prompt_ids), run_mixed(model, prompt_ids)
    for key, rows in reference.items():
        torch.testing.assert_close(torch.stack(ours[key]), torch.stack(rows), rtol=1e-4, atol=1e-4)


def test_dense_asks_nothing_of_the_device():
    model = torch.nn.Linear(2, 2)
    assert apply_weight_layout(model, "dense", "meta", torch.float16) == WeightLayout("dense")


@packings
def test_a_copied_model_packs_its_own_weight(packing):
    model = torch.nn.Sequential()
    from pdserve.model.layers import Linear

    linear = Linear(64, 32)
    torch.nn.init.normal_(linear.weight)
    model.append(linear)
    pack_linears(model, packing)
    twin = copy.deepcopy(model)
    assert twin[0].packed is not linear.packed
    assert twin[0].packed.weight is twin[0].weight  # the copy's own parameter, not a third copy
    with torch.no_grad():
        linear.weight.zero_()  # the twin computes from its own packing, not from the original's
    x = torch.randn(9, 64)
    torch.testing.assert_close(twin(x), x @ twin[0].weight, rtol=1e-5, atol=1e-4)
    assert not torch.equal(twin(x), torch.zeros(9, 32))
