"""The panels for decode-sized products (pdserve/cpu/panel_weights.py, pdserve/native/row_panels.py):
the product against the dense one at every row count of a tile and past it, odd widths and depths,
strided and non-float32 inputs, biases, threads over panels and row tiles, rows past a block of
L2 (each row's sum its own); a Linear reading them only up to PANEL_MAX_ROWS rows; a copied model
packing its own; a model's logits against the dense model's; and the machines where they do not
build."""

from __future__ import annotations

import copy

import pytest
import torch

from pdserve.cpu.panel_weights import load_row_panels
from pdserve.cpu.weight_layout import (PANELS, WeightLayout, WeightLayoutUnavailable, apply_weight_layout,
                                       stream_linears)
from pdserve.model.layers import Linear
from pdserve.model.row_route import DENSE, PANEL_MAX_ROWS, RowRoute
from pdserve.model.row_route import PANELS as PANELS_KIND
from pdserve.native.row_panels import RowPanels
from tests.helpers.kernels import built

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def panels() -> RowPanels:
    return built(load_row_panels("cpu", torch.float32), "the panel kernel")


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x @ weight if bias is None else torch.addmm(bias, x, weight)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 12, 13, 40, 67])
@pytest.mark.parametrize(("inputs", "outputs"), [(96, 200), (1, 64), (3, 1), (577, 65), (64, 40), (130, 128),
                                                   (96, 130), (33, 448)])  # a group of 3 panels ending short; 7 panels
def test_the_product_equals_the_dense_one(panels, rows, inputs, outputs):
    gen = torch.Generator().manual_seed(rows * 1000 + inputs + outputs)
    weight, x = torch.randn(inputs, outputs, generator=gen), torch.randn(rows, inputs, generator=gen)
    torch.testing.assert_close(panels.pack(weight)(x, None), dense(x, weight), rtol=1e-5, atol=1e-4)


def test_the_panels_hold_the_weight_by_columns_of_the_kernels_width_and_pad_the_last(panels):
    width = panels.width
    assert width in (16, 64)  # AVX-512 builds 64 columns a panel, other instruction sets 16
    weight = torch.arange(3 * (width + 6), dtype=torch.float32).view(3, width + 6)
    packed = panels.pack(weight)
    assert packed.panels.shape == (2, 3, width)
    assert torch.equal(packed.panels[0], weight[:, :width])
    assert torch.equal(packed.panels[1, :, :6], weight[:, width:])
    assert not packed.panels[1, :, 6:].any()


@pytest.mark.parametrize("rows", [1, 4, 6])
def test_a_bias_is_added(panels, rows):
    weight, bias, x = torch.randn(48, 80), torch.randn(80), torch.randn(rows, 48)
    torch.testing.assert_close(panels.pack(weight)(x, bias), dense(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_strided_rows_are_read_in_place_and_other_inputs_as_their_values(panels):
    weight = torch.randn(64, 96)
    wide = torch.randn(5, 160)
    torch.testing.assert_close(panels.pack(weight)(wide[:, 32:96], None), dense(wide[:, 32:96], weight),
                               rtol=1e-5, atol=1e-4)  # a view of a fused projection's output
    column_major = torch.randn(64, 3).t()
    torch.testing.assert_close(panels.pack(weight)(column_major, None), dense(column_major.contiguous(), weight),
                               rtol=1e-5, atol=1e-4)
    doubles = torch.randn(2, 64, dtype=torch.float64)
    torch.testing.assert_close(panels.pack(weight)(doubles, None), dense(doubles.float(), weight),
                               rtol=1e-5, atol=1e-4)


def test_one_row_is_read_in_place_whatever_its_row_stride(panels):
    weight = torch.randn(64, 70)
    row = torch.randn(64, 1).t().contiguous()  # [1, 64] with stride (1, 1), as a tied embedding's
    torch.testing.assert_close(panels.pack(weight)(row, None), dense(row, weight), rtol=1e-5, atol=1e-4)


def test_a_wrong_input_is_refused_with_the_shape_it_needs(panels):
    packed = panels.pack(torch.randn(64, 32))
    with pytest.raises(ValueError, match=r"a \[T, 64\] CPU input multiplies this weight, got \[2, 63\]"):
        packed(torch.randn(2, 63), None)
    with pytest.raises(ValueError, match=r"got \[64\]"):
        packed(torch.randn(64), None)


def test_the_product_goes_into_the_buffer_given(panels):
    weight, bias, x = torch.randn(64, 70), torch.randn(70), torch.randn(9, 64)
    out = torch.full((9, 70), float("nan"))
    y = panels.pack(weight)(x, bias, out)
    assert y.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, dense(x, weight, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("out", [torch.empty(9, 71), torch.empty(9, 70, dtype=torch.float64),
                                 torch.empty(70, 9).t()], ids=["shape", "dtype", "strided"])
def test_a_wrong_buffer_is_refused_with_the_one_it_needs(panels, out):
    with pytest.raises(ValueError, match=r"goes into a contiguous float32 \[9, 70\] CPU tensor"):
        panels.pack(torch.randn(64, 70))(torch.randn(9, 64), None, out)


@pytest.mark.parametrize(("rows", "inputs", "outputs"), [
    (1, 1024, 1124), (3, 1024, 1124), (6, 1024, 1124),  # a weight over 4 MB
    (64, 256, 582), (67, 300, 450)])  # over 8M multiply-adds; row tiles split unevenly
def test_a_large_product_splits_over_threads_with_the_same_result(panels, rows, inputs, outputs):
    assert panels.threads(rows, inputs, outputs, 3) == 3
    weight, x = torch.randn(inputs, outputs), torch.randn(rows, inputs)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        torch.testing.assert_close(panels.pack(weight)(x, None), dense(x, weight), rtol=1e-4, atol=1e-3)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("threads", [1, 3])
def test_rows_past_an_l2_block_give_each_row_its_own_sum_bit_for_bit(panels, threads):
    # 300 rows of 8,192 inputs: 9.8 MB of x, several blocks of rows on any L2 (row_panels.c)
    gen = torch.Generator().manual_seed(7)
    weight, x = torch.randn(8192, 70, generator=gen), torch.randn(300, 8192, generator=gen)
    packed, before = panels.pack(weight), torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        together = packed(x, None)
    finally:
        torch.set_num_threads(before)
    alone = torch.cat([packed(x[i : i + 1], None) for i in (0, 5, 6, 131, 299)])
    assert torch.equal(together[[0, 5, 6, 131, 299]], alone)
    torch.testing.assert_close(together, dense(x, weight), rtol=1e-4, atol=1e-2)


def test_a_product_is_threaded_by_its_weight_or_its_multiply_adds(panels):
    assert panels.threads(1, 1024, 1024, 4) == 4 and panels.threads(1, 1024, 1023, 4) == 1  # 4 MB of weight
    assert panels.threads(32, 512, 512, 4) == 4 and panels.threads(31, 512, 512, 4) == 1  # 8M multiply-adds
    assert panels.threads(1, 1024, 1024, 4096) == 1024 // panels.width  # no more threads than (panel, row tile) pairs
    assert panels.threads(1, 1024, 1024, 0) == 1


class Spy:
    def __init__(self, weight: torch.Tensor):
        self.weight, self.rows = weight, []

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        self.rows.append(x.shape[0])
        return x @ self.weight


def test_a_linear_reads_the_panels_up_to_their_row_limit_only():
    linear = Linear(8, 4)
    torch.nn.init.normal_(linear.weight)
    linear.streamed = spy = Spy(linear.weight)
    for rows in (1, PANEL_MAX_ROWS, PANEL_MAX_ROWS + 1, 2 * PANEL_MAX_ROWS):
        linear(torch.randn(rows, 8))
    assert spy.rows == [1, PANEL_MAX_ROWS]
    linear.route = RowRoute((1, 16), (PANELS_KIND, DENSE, PANELS_KIND))  # a route auto measured here
    for rows in (1, 2, 16, 17, 500):
        linear(torch.randn(rows, 8))
    assert spy.rows == [1, PANEL_MAX_ROWS, 1, 17, 500]


def test_a_copied_model_packs_its_own_weight(panels):
    model = torch.nn.Sequential(Linear(64, 32))
    torch.nn.init.normal_(model[0].weight)
    assert stream_linears(model, panels).linears == 1
    twin = copy.deepcopy(model)
    assert twin[0].streamed is not model[0].streamed and twin[0].streamed.weight is twin[0].weight
    with torch.no_grad():
        model[0].weight.zero_()  # the original's panels are a copy: the twin computes from its own
    x = torch.randn(2, 64)
    torch.testing.assert_close(twin(x), x @ twin[0].weight, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2_bias", "llama_untied"])  # q/k/v biases; an untied lm_head
def test_a_model_in_panels_computes_the_dense_models_logits(tiny_loaded, panels, name):
    """Mixed passes: decode steps of one to a few sequences and the lm_head's few rows read the
    panels, prefill chunks the dense weight."""
    from tests.model.test_model_mixed_batch import prompts, run_mixed

    model = tiny_loaded[name].model
    streamed = copy.deepcopy(model)
    assert apply_weight_layout(streamed, PANELS, "cpu", torch.float32) == WeightLayout("dense", PANELS)
    assert all(m.streamed is not None for m in streamed.modules() if isinstance(m, Linear))
    prompt_ids = prompts(model.config.vocab_size)
    ours, reference = run_mixed(streamed, prompt_ids), run_mixed(model, prompt_ids)
    for key, rows in reference.items():
        torch.testing.assert_close(torch.stack(ours[key]), torch.stack(rows), rtol=1e-4, atol=1e-4)


def test_other_devices_and_dtypes_say_why():
    assert load_row_panels("meta", torch.float32) == (None, "device meta is not a CPU")
    assert load_row_panels("cpu", torch.bfloat16) == (None, "the panels compute float32, not torch.bfloat16")


def test_without_a_compiler_auto_multiplies_few_rows_as_many(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    model = torch.nn.Sequential(Linear(8, 4))
    layout = apply_weight_layout(model, "auto", "cpu", torch.float32)
    assert layout.few_rows is None and model[0].streamed is None
    with pytest.raises(WeightLayoutUnavailable, match="panels weights unavailable: .*/bin/false"):
        apply_weight_layout(model, PANELS, "cpu", torch.float32)
