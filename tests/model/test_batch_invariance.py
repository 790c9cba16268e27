"""The probe behind deterministic mode: every kernel it runs on a token's row gives that row the
same bits alone and inside batches of other sizes, at any place in the batch, on one thread or
two (a prefill worker and a decode worker may run on different core counts). What the default
mode runs instead is not asserted here: torch's dense `x @ W` changes a row's bits with the row
count on this CPU (benchmarks/batch_invariance.py prints what each kernel does; docs/BENCHMARKS.md,
"Deterministic mode"), and the GEMM libraries promise nothing either way."""

from __future__ import annotations

import pytest
import torch

from benchmarks.batch_invariance import first_variant_batch
from pdserve.checkpoint.rope_scaling import NoRopeScaling
from pdserve.cpu.panel_weights import load_row_panels
from pdserve.model.layer_kernels import TorchKernels
from pdserve.model.rope import RotaryEmbedding
from pdserve.model.tiled_rows import CPU_TILE_ROWS, TiledRows
from pdserve.native.layer_kernels import load_layer_kernels_library
from pdserve.requests import SamplingParams
from pdserve.sampling.filters import SamplingTensors, filtered_probs
from pdserve.sampling.sampler import argmax_rows
from tests.helpers.kernels import built

pytestmark = pytest.mark.timeout(300)


def weight(rows: int, cols: int) -> torch.Tensor:
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows + cols)) * 0.05


@pytest.fixture(scope="module")
def panels():
    return built(load_row_panels("cpu", torch.float32), "the panel kernel")


@pytest.fixture(scope="module")
def native_kernels():
    return built(load_layer_kernels_library(), "the native layer kernels")


@pytest.mark.parametrize(("inputs", "outputs"), [(576, 960), (1536, 576), (64, 384), (40, 72)])
def test_the_panels_compute_each_row_alone(panels, inputs, outputs):
    packed = panels.pack(weight(inputs, outputs))
    bias = torch.randn(outputs)
    assert first_variant_batch(lambda x: packed(x, bias), inputs) is None


@pytest.mark.parametrize(("inputs", "outputs"), [(576, 960), (64, 384)])
def test_fixed_tiles_compute_each_row_alone(inputs, outputs):
    dense = weight(inputs, outputs)
    tiled = TiledRows(dense, CPU_TILE_ROWS)
    assert first_variant_batch(lambda x: tiled(x, None), inputs) is None
    x, bias = torch.randn(37, inputs), torch.randn(outputs)
    torch.testing.assert_close(tiled(x, bias), x @ dense + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_norms_and_activations_compute_each_row_alone(kernels, native_kernels):
    ops = TorchKernels() if kernels == "torch" else native_kernels
    scale = torch.randn(576)
    assert first_variant_batch(lambda x: ops.rms_norm(x, scale, 1e-5), 576) is None
    assert first_variant_batch(lambda x: ops.silu_mul(x.clone()).contiguous(), 2 * 200) is None
    assert first_variant_batch(lambda x: TorchKernels().gelu_tanh_mul(x.clone()).contiguous(), 2 * 200) is None


@pytest.mark.parametrize("head_dim", [16, 32, 64])
@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_rotary_positions_compute_each_row_alone(kernels, head_dim, native_kernels):
    ops = TorchKernels() if kernels == "torch" else native_kernels
    rotary = RotaryEmbedding(head_dim, 10000.0, NoRopeScaling())

    def rotated(x: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary((x[:, 0].abs() * 1000).long(), torch.float32)  # a position per row
        return ops.rope(x.view(x.shape[0], -1, head_dim).clone(), cos, sin).reshape(x.shape[0], -1)

    assert first_variant_batch(rotated, 3 * head_dim) is None


def test_sampling_and_logprobs_compute_each_row_alone():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, min_p=0.01)

    def probs(x: torch.Tensor) -> torch.Tensor:
        return filtered_probs(x, SamplingTensors.from_params([params] * x.shape[0], x.device))

    assert first_variant_batch(probs, 4096) is None
    assert first_variant_batch(lambda x: torch.log_softmax(x, dim=-1), 4096) is None
    assert first_variant_batch(lambda x: argmax_rows(x)[:, None], 4096) is None
