"""The C decode kernel alone: against dense attention at head sizes that take its 16-position
segments (64, 128, any multiple of 16 up to 256) and that go a position at a time (a lane tail, or
over 256), block sizes below, at and above a segment, query-head groups that make one span, several
(full and a remainder) or single heads, threads; the plan refusing what the kernel could not
read safely; pools of bfloat16 and float16 (each element widened to float32 as it is read, every
sum float32; the kernel's copy into them rounding as torch converts); a machine where the kernel
cannot be built keeps torch-batched working on its sparse products, saying why once."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from pdserve.attention import make_attention_backend
from pdserve.attention.batch import SeqSpan
from pdserve.attention.batched_backend import plan_native_decodes
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from pdserve.native import loader
from pdserve.native.paged_decode import NativeDecode, load_native_decode
from tests.attention.naive import naive_attention
from tests.helpers.kernels import decode_kernel

LAYERS = 3
POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(scope="module")
def native_decode() -> NativeDecode:
    return decode_kernel()


def random_pool(lengths, heads, kv_heads, head_dim, block_size, seed, dtype=torch.float32):
    """A pool of random K/V, each sequence on shuffled blocks; returns kv, spans, q [L, B, H, D]."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lengths]
    kv = KVCache(KVShape(LAYERS, kv_heads, head_dim, block_size), sum(need) + 2, dtype, "cpu")
    kv.data.copy_(torch.randn(kv.data.shape, generator=gen))
    order = torch.randperm(kv.num_blocks, generator=gen).tolist()
    spans, start = [], 0
    for i, (n, blocks) in enumerate(zip(lengths, need)):
        spans.append(SeqSpan(i, 1, n, tuple(order[start : start + blocks])))
        start += blocks
    return kv, spans, torch.randn(LAYERS, len(lengths), heads, head_dim, generator=gen)


def dense_context(kv: KVCache, span: SeqSpan, layer: int):
    """[n, Hkv, D] keys and values of one sequence, gathered the plain way."""
    n, size = span.context_len, kv.block_size
    rows = [kv.data[span.block_table[p // size], layer, :, p % size] for p in range(n)]  # each [2, Hkv, D]
    both = torch.stack(rows)  # [n, 2, Hkv, D]
    return both[:, 0], both[:, 1]


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"),
                         [(9, 3, 64), (8, 1, 40), (4, 4, 20), (14, 2, 128), (6, 2, 48), (16, 2, 64),
                          (5, 1, 64), (12, 12, 64), (4, 2, 256), (2, 1, 272)])
@pytest.mark.parametrize("block_size", [16, 8, 32])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", POOL_DTYPES)
def test_the_kernel_equals_dense_attention(native_decode, heads, kv_heads, head_dim, block_size, threads, dtype):
    """A half pool's keys and values are compared as what they hold: the same values in float64."""
    if not native_decode.serves(dtype):
        pytest.skip(f"the kernel was compiled without {dtype} (no _Float16 in this compiler)")
    lengths = [1, 5, 16, 17, 31, 33, 63, 130]
    kv, spans, q = random_pool(lengths, heads, kv_heads, head_dim, block_size, seed=heads + head_dim + block_size,
                               dtype=dtype)
    plan = dataclasses.replace(plan_native_decodes(native_decode, spans, kv), threads=threads)
    for layer in range(LAYERS):
        out = native_decode.attend(q[layer], kv.data, layer, plan)
        for b, span in enumerate(spans):
            keys, values = (x.float() for x in dense_context(kv, span, layer))
            expected = naive_attention(q[layer][b : b + 1], keys, values, span.context_len - 1)
            torch.testing.assert_close(out[b : b + 1].double(), expected, rtol=1e-5, atol=1e-5)


def test_more_threads_than_work_and_one_sequence(native_decode):
    kv, spans, q = random_pool([7], 2, 1, 8, block_size=4, seed=3)
    plan = dataclasses.replace(plan_native_decodes(native_decode, spans, kv), threads=16)
    keys, values = dense_context(kv, spans[0], 1)
    torch.testing.assert_close(native_decode.attend(q[1], kv.data, 1, plan).double(),
                               naive_attention(q[1], keys, values, 6), rtol=1e-5, atol=1e-5)


def test_a_block_outside_the_pool_is_refused_before_the_kernel_reads(native_decode):
    kv, spans, _ = random_pool([5, 9], 4, 2, 8, block_size=4, seed=1)
    bad = dataclasses.replace(spans[1], block_table=(0, kv.num_blocks + 3, 1))
    with pytest.raises(ValueError, match="outside the pool"):
        plan_native_decodes(native_decode, [spans[0], bad], kv)
    short = dataclasses.replace(spans[1], block_table=(0,))
    with pytest.raises(ValueError, match="shorter than its context"):
        plan_native_decodes(native_decode, [short], kv)
    with pytest.raises(ValueError, match="do not cover"):
        native_decode.plan(torch.zeros(1, 1, dtype=torch.long), [kv.block_size + 1], kv.data)


def test_without_a_working_compiler_torch_batched_uses_its_sparse_products(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    loader._fallbacks.cache_clear()  # this process's first fallback of the kernel
    with caplog.at_level(logging.WARNING):
        backend = make_attention_backend("torch-batched", "cpu", torch.float32)
        kernel, problem = load_native_decode()
    assert kernel is None and "/bin/false" in problem
    [warning] = [r for r in caplog.records if r.name == loader.log.name]  # once, however often it fails
    assert warning.getMessage().startswith("decode attention kernel unavailable (")
    assert "/bin/false" in warning.getMessage() and warning.getMessage().endswith(
        "): using the sparse products, slower decode")
    kv, spans, q = random_pool([3, 9], 4, 2, 8, block_size=4, seed=2)
    from pdserve.attention.batch import ForwardBatch

    ids = torch.zeros(2, dtype=torch.long)
    slots = torch.tensor([spans[i].block_table[(n - 1) // 4] * 4 + (n - 1) % 4 for i, n in enumerate([3, 9])])
    backend.begin(ForwardBatch(ids, ids, slots, tuple(spans), torch.arange(2)), kv)
    k = v = torch.randn(2, 2, 8)
    assert backend.forward(0, q[0], k, v, kv).shape == (2, 4, 8)


def test_the_library_is_built_once_and_then_loaded_from_the_cache(tmp_path, monkeypatch, native_decode):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    decode_kernel()
    built = _listed(tmp_path)
    assert len(built) == 2 and built[0].startswith("paged_decode-") and built[0].endswith(".so")
    assert built[1] == built[0] + ".needs"  # the target's features, checked before every load
    decode_kernel()
    assert _listed(tmp_path) == built  # no second build, no temporary left


def _listed(cache) -> list[str]:
    """The cache's files but the build's lock files (dotfiles, kept for the next build's lock)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))


def test_loading_the_kernel_leaves_the_process_floating_point_state_alone(native_decode):
    """Built with -ffast-math but not linked with it: gcc's crtfastmath.o would flush denormals
    to zero for the whole process (numpy, hypothesis and every other library in it)."""
    import numpy as np

    decode_kernel()
    assert np.float32(1e-38) / np.float32(1000) > 0


@pytest.mark.parametrize("dtype", POOL_DTYPES)
def test_the_kernels_copy_into_the_pool_equals_kv_write(native_decode, dtype):
    """Into a half pool too, bit for bit: the kernel rounds a float to nearest, ties to even, as
    torch converts (KVCache.write)."""
    if not native_decode.serves(dtype):
        pytest.skip(f"the kernel was compiled without {dtype} (no _Float16 in this compiler)")
    kv, _, _ = random_pool([40], 4, 2, 16, block_size=8, seed=5, dtype=dtype)
    expected = KVCache(kv.shape, kv.num_blocks, dtype, "cpu")
    expected.data.copy_(kv.data)
    fused = torch.randn(6, 8 * 16)  # as the qkv projection's output: q heads, then k, then v
    k, v = fused[:, 4 * 16 : 6 * 16].view(6, 2, 16), fused[:, 6 * 16 :].view(6, 2, 16)  # strided rows
    slots = torch.tensor([0, 9, 10, 17, kv.num_blocks * 8 - 1, 3])
    assert NativeDecode.slots_problem(slots, kv.data) is None
    native_decode.write(kv.data, 2, slots, k, v)
    expected.write(2, slots, k, v)
    assert torch.equal(kv.data, expected.data)


def test_slots_outside_the_pool_go_to_kv_write_which_refuses_them(native_decode):
    kv, spans, q = random_pool([3], 4, 2, 8, block_size=4, seed=2)
    assert "outside the pool's" in NativeDecode.slots_problem(torch.tensor([0, kv.num_blocks * 4]), kv.data)
    assert "outside the pool's" in NativeDecode.slots_problem(torch.tensor([-1]), kv.data)
    assert "int64" in NativeDecode.slots_problem(torch.tensor([0], dtype=torch.int32), kv.data)
    from pdserve.attention.batch import ForwardBatch

    backend = make_attention_backend("torch-batched", "cpu", torch.float32)
    ids = torch.zeros(1, dtype=torch.long)
    backend.begin(ForwardBatch(ids, ids, torch.tensor([kv.num_blocks * 4]), tuple(spans), ids), kv)
    with pytest.raises(IndexError):
        backend.forward(0, q[0], torch.randn(1, 2, 8), torch.randn(1, 2, 8), kv)


def test_strided_queries_are_read_where_they_lie(native_decode):
    kv, spans, q = random_pool([5, 20, 33], 6, 2, 16, block_size=16, seed=4)
    plan = plan_native_decodes(native_decode, spans, kv)
    fused = torch.randn(3, 10 * 16)
    strided = fused[:, : 6 * 16].view(3, 6, 16)
    contiguous = native_decode.attend(strided.contiguous(), kv.data, 1, plan)
    assert torch.equal(native_decode.attend(strided, kv.data, 1, plan), contiguous)
