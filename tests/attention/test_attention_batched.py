"""The torch-batched backend against dense float64 attention and against the reference backend,
with its decodes computed both ways: by the C kernel (native_decode.py) and by the sparse products
(pool_rows.py)."""

from __future__ import annotations

import pytest
import torch

from pdserve.attention import AttentionBackendUnavailable, make_attention_backend
from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from tests.attention.naive import naive_attention
from tests.attention.test_attention_torch import LAYERS, Case, build, new_kv, new_rows

DECODES = ["native", "sparse"]


@pytest.fixture(params=DECODES)
def decodes(request, native_decode):
    """The torch-batched backend's decode implementation: the C kernel or the sparse products."""
    return native_decode if request.param == "native" else None


def run_both(cases, heads, kv_heads, head_dim=16, block_size=4, seed=0, shuffle=False, native=None):
    """Each layer through both backends on copies of one pool; checks against dense attention,
    returns the largest difference between the two backends and the two pools afterwards."""
    kv, batch, q, keys, values = build(cases, heads, kv_heads, head_dim, block_size, seed, shuffle)
    ref_kv = KVCache(kv.shape, kv.num_blocks, kv.data.dtype, "cpu")
    ref_kv.data.copy_(kv.data)
    ours, ref = BatchedTorchBackend(native), TorchAttentionBackend()
    ours.begin(batch, kv)
    ref.begin(batch, ref_kv)
    worst = 0.0
    for layer in range(LAYERS):
        k, v = new_kv(batch, cases, keys, values, layer)
        out = ours.forward(layer, q[layer], k, v, kv)
        expected_all = ref.forward(layer, q[layer], k, v, ref_kv)
        assert out.shape == q[layer].shape
        for i, case in enumerate(cases):
            expected = naive_attention(q[layer][new_rows(batch, i)], keys[i][layer], values[i][layer], case.cached)
            torch.testing.assert_close(out[new_rows(batch, i)].double(), expected, rtol=1e-5, atol=1e-5)
        worst = max(worst, float((out - expected_all).abs().max()))
    return worst, kv, ref_kv


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (9, 3), (8, 2), (4, 1)])
def test_decodes_of_mixed_lengths_match_dense_and_the_reference(heads, kv_heads, decodes):
    cases = [Case(0, 1), Case(3, 1), Case(4, 1), Case(17, 1), Case(40, 1)]
    worst, _, _ = run_both(cases, heads, kv_heads, native=decodes)
    assert worst < 1e-5


def test_decodes_of_one_length_match(decodes):
    worst, _, _ = run_both([Case(11, 1)] * 6, 6, 2, native=decodes)
    assert worst < 1e-5


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_block_sizes(block_size, decodes):
    cases = [Case(5, 1), Case(16, 1), Case(31, 1), Case(0, 1)]
    worst, _, _ = run_both(cases, 6, 3, block_size=block_size, native=decodes)
    assert worst < 1e-5


@pytest.mark.parametrize("seed", range(4))
def test_mixed_batch_of_chunks_and_decodes(seed, decodes):
    cases = [Case(0, 12), Case(7, 1), Case(20, 9), Case(0, 1), Case(33, 1), Case(9, 30)]
    worst, _, _ = run_both(cases, 9, 3, seed=seed, shuffle=seed % 2 == 1, native=decodes)
    assert worst < 1e-5


def test_chunks_only_and_rows_out_of_order(decodes):
    run_both([Case(0, 5), Case(4, 6)], 4, 2, seed=1, native=decodes)
    run_both([Case(3, 1), Case(0, 5), Case(10, 1), Case(4, 6)], 4, 2, seed=3, shuffle=True, native=decodes)


def test_the_pool_ends_up_as_the_reference_leaves_it(decodes):
    _, kv, ref_kv = run_both([Case(2, 3), Case(5, 1), Case(9, 1)], 4, 2, native=decodes)
    assert torch.equal(kv.data, ref_kv.data)


def test_a_decode_in_the_last_block_of_the_pool_reads_inside_it(decodes):
    """The shifted per-layer views end exactly at the pool's end: a sequence whose blocks are
    the pool's last ones, read in every layer (a view past the end would raise or read garbage)."""
    from pdserve.attention.batch import ForwardBatch, SeqSpan

    gen = torch.Generator().manual_seed(5)
    kv = KVCache(KVShape(LAYERS, 2, 8, 4), 4, torch.float32, "cpu")
    table, context = (2, 3), 8
    keys = torch.randn(LAYERS, context, 2, 8, generator=gen)
    values = torch.randn(LAYERS, context, 2, 8, generator=gen)
    slots = torch.tensor([table[p // 4] * 4 + p % 4 for p in range(context)])
    for layer in range(LAYERS):
        kv.write(layer, slots[:-1], keys[layer, :-1], values[layer, :-1])
    q = torch.randn(LAYERS, 1, 4, 8, generator=gen)
    one = torch.zeros(1, dtype=torch.long)
    batch = ForwardBatch(one, one, slots[-1:], (SeqSpan(0, 1, context, table),), one)
    backend = BatchedTorchBackend(decodes)
    backend.begin(batch, kv)
    for layer in range(LAYERS):
        out = backend.forward(layer, q[layer], keys[layer, -1:], values[layer, -1:], kv)
        expected = naive_attention(q[layer], keys[layer], values[layer], context - 1)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_factory_gives_it_on_cpu_and_refuses_elsewhere():
    assert isinstance(make_attention_backend("torch-batched", "cpu", torch.float32), BatchedTorchBackend)
    with pytest.raises(AttentionBackendUnavailable, match="float32/float64"):
        make_attention_backend("torch-batched", "cpu", torch.bfloat16)  # below a bfloat16 model
    with pytest.raises(AttentionBackendUnavailable, match="runs on the CPU"):
        make_attention_backend("torch-batched", "cuda", torch.float32)


def test_a_pool_of_another_kind_is_refused_at_begin():
    kv, batch, *_ = build([Case(3, 1)], 4, 2, 8, 4, seed=0)
    kv.data = kv.data.to(torch.int16)
    with pytest.raises(ValueError, match="float32/float64/bfloat16/float16"):
        BatchedTorchBackend().begin(batch, kv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(2))
def test_a_half_pool_below_float32_queries_computes_as_the_reference_reads_it(dtype, seed, decodes):
    """Chunks and decodes over a half pool (its keys and values rounded as stored, widened as
    read): the same outputs as the reference backend over a copy of the pool, and the same pool
    after (the C kernel's copy rounds as torch converts)."""
    if decodes is not None and not decodes.serves(dtype):
        pytest.skip(f"the kernel was compiled without {dtype}")
    cases = [Case(0, 12), Case(7, 1), Case(20, 9), Case(0, 1), Case(33, 1), Case(9, 30)]
    full, batch, q, keys, values = build(cases, 9, 3, 16, 4, seed, seed % 2 == 1)
    pools = [KVCache(full.shape, full.num_blocks, dtype, "cpu") for _ in range(2)]
    for kv in pools:
        kv.data.copy_(full.data)
    ours, ref = BatchedTorchBackend(decodes), TorchAttentionBackend()
    for backend, kv in zip((ours, ref), pools):
        backend.begin(batch, kv)
    for layer in range(LAYERS):
        k, v = new_kv(batch, cases, keys, values, layer)
        out, expected = (backend.forward(layer, q[layer], k, v, kv) for backend, kv in zip((ours, ref), pools))
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(pools[0].data, pools[1].data)


def test_forward_before_begin_is_an_error():
    kv = KVCache(KVShape(1, 1, 4, 4), 2, torch.float32, "cpu")
    with pytest.raises(AssertionError, match="begin"):
        BatchedTorchBackend().forward(0, torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), kv)
