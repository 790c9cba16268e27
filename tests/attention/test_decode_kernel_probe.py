"""torch-batched's decodes on the C kernel or the sparse products, whichever measured faster on
this machine: the choice from the timings, the probe on a real kernel, the figure kept."""

from __future__ import annotations

import pytest

from pdserve.attention import decode_kernel_probe
from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.decode_kernel_probe import DecodeKernelTimings, measure_kernels, tune_decode_kernel
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.kv.kv_shape import KVShape
from pdserve.native.paged_decode import NativeDecode, load_native_decode

SHAPE = KVShape(num_layers=2, num_kv_heads=2, head_dim=16, block_size=4)


@pytest.fixture()
def kernel() -> NativeDecode:
    native, problem = load_native_decode()
    if native is None:
        pytest.skip(f"no decode kernel here: {problem}")
    return native


def test_the_kernel_is_kept_where_its_total_is_no_larger():
    assert DecodeKernelTimings(((1, 8), (4, 8)), native=(1.0, 3.0), sparse=(2.0, 2.0)).native_faster
    assert not DecodeKernelTimings(((1, 8), (4, 8)), native=(1.0, 4.0), sparse=(2.0, 2.0)).native_faster
    timings = DecodeKernelTimings(((1, 8),), native=(1.0,), sparse=(2.0,))
    assert DecodeKernelTimings.from_json(timings.to_json()) == timings


def test_the_probe_times_both_kernels_at_every_shape(kernel, monkeypatch):
    monkeypatch.setattr(decode_kernel_probe, "PROBE_SHAPES", ((1, 5), (3, 9)))
    timings = measure_kernels(BatchedTorchBackend(kernel), SHAPE, heads=4)
    assert timings.shapes == ((1, 5), (3, 9)) and all(t > 0 for t in (*timings.native, *timings.sparse))


@pytest.mark.parametrize("native_faster", [True, False])
def test_tuning_keeps_the_faster_kernel_and_the_figure(kernel, monkeypatch, tmp_path, native_faster):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    fast, slow = (1.0,), (2.0,)
    measured = DecodeKernelTimings(((1, 8),), *((fast, slow) if native_faster else (slow, fast)))
    monkeypatch.setattr(decode_kernel_probe, "measure_kernels", lambda attn, shape, heads: measured)
    backend = BatchedTorchBackend(kernel)
    assert tune_decode_kernel(backend, SHAPE, heads=4) == measured
    assert (backend.native is kernel) is native_faster
    monkeypatch.setattr(decode_kernel_probe, "measure_kernels", lambda *a: pytest.fail("measured twice"))
    assert tune_decode_kernel(BatchedTorchBackend(kernel), SHAPE, heads=4) == measured  # kept


def test_nothing_to_choose_without_the_kernel_or_another_backend():
    assert tune_decode_kernel(BatchedTorchBackend(None), SHAPE, heads=4) is None
    assert tune_decode_kernel(TorchAttentionBackend(), SHAPE, heads=4) is None
