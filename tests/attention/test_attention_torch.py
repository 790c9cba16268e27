"""The torch backend against dense float64 attention, over the paged pool, in mixed batches."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from tests.attention.naive import naive_attention

LAYERS = 2


@dataclass
class Case:
    """One sequence in the pass: `cached` tokens already in the pool, `new` computed now."""

    cached: int
    new: int


def build(
    cases: list[Case], heads: int, kv_heads: int, head_dim: int, block_size: int, seed: int, shuffle: bool = False
):
    """Pool with random cached K/V, a batch for the new tokens, and the dense per-sequence K/V."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    need = sum(-(-(c.cached + c.new) // block_size) for c in cases)
    kv = KVCache(KVShape(LAYERS, kv_heads, head_dim, block_size), need + 3, torch.float32, "cpu")
    free = list(range(need + 3))
    rng.shuffle(free)
    order = list(range(len(cases)))
    if shuffle:
        rng.shuffle(order)
    spans, slots, full_keys, full_values = {}, [], {}, {}
    start = 0
    for index in order:
        case = cases[index]
        total = case.cached + case.new
        blocks = [free.pop() for _ in range(-(-total // block_size))]
        seq_slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(total)])
        full_keys[index] = torch.randn(LAYERS, total, kv_heads, head_dim, generator=gen)
        full_values[index] = torch.randn(LAYERS, total, kv_heads, head_dim, generator=gen)
        cached = seq_slots[: case.cached]
        for layer in range(LAYERS):
            kv.write(layer, cached, full_keys[index][layer, : case.cached], full_values[index][layer, : case.cached])
        spans[index] = SeqSpan(start, case.new, total, tuple(blocks))
        slots.append(seq_slots[case.cached :])
        start += case.new
    tokens = start
    q = torch.randn(LAYERS, tokens, heads, head_dim, generator=gen)
    batch = ForwardBatch(
        input_ids=torch.zeros(tokens, dtype=torch.long),
        positions=torch.zeros(tokens, dtype=torch.long),
        slot_mapping=torch.cat(slots),
        seqs=tuple(spans[i] for i in range(len(cases))),  # listed in case order, laid out in `order`
        logits_indices=torch.zeros(0, dtype=torch.long),
    )
    return kv, batch, q, full_keys, full_values


def new_rows(batch: ForwardBatch, index: int) -> slice:
    span = batch.seqs[index]
    return slice(span.query_start, span.query_start + span.query_len)


def new_kv(batch: ForwardBatch, cases, keys, values, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pass's new keys and values of `layer` ([tokens, Hkv, D] each): every case's past its cache."""
    k = torch.empty(batch.num_tokens, *keys[0].shape[2:])
    v = torch.empty_like(k)
    for i, case in enumerate(cases):
        k[new_rows(batch, i)] = keys[i][layer, case.cached :]
        v[new_rows(batch, i)] = values[i][layer, case.cached :]
    return k, v


def run_and_check(cases, heads, kv_heads, head_dim=16, block_size=4, seed=0, shuffle=False):
    kv, batch, q, keys, values = build(cases, heads, kv_heads, head_dim, block_size, seed, shuffle)
    backend = TorchAttentionBackend()
    backend.begin(batch, kv)
    for layer in range(LAYERS):
        k, v = new_kv(batch, cases, keys, values, layer)
        out = backend.forward(layer, q[layer], k, v, kv)
        assert out.shape == q[layer].shape
        for i, case in enumerate(cases):
            expected = naive_attention(q[layer][new_rows(batch, i)], keys[i][layer], values[i][layer], case.cached)
            torch.testing.assert_close(out[new_rows(batch, i)].double(), expected, rtol=1e-5, atol=1e-5)
    return kv, batch, keys, values


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (9, 3), (8, 2), (4, 1)])
def test_decode_group_matches_dense(heads, kv_heads):
    run_and_check([Case(0, 1), Case(3, 1), Case(4, 1), Case(17, 1), Case(40, 1)], heads, kv_heads)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_fresh_prefills_match_dense(block_size):
    run_and_check([Case(0, 9), Case(0, 33), Case(0, 2)], 8, 2, block_size=block_size)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_chunks_after_a_cached_prefix_match_dense(block_size):
    run_and_check([Case(5, 7), Case(16, 16), Case(31, 2)], 6, 3, block_size=block_size)


@pytest.mark.parametrize("seed", range(4))
def test_mixed_batch_matches_dense(seed):
    cases = [Case(0, 12), Case(7, 1), Case(20, 9), Case(0, 1), Case(33, 1), Case(9, 30)]
    run_and_check(cases, 9, 3, seed=seed, shuffle=seed % 2 == 1)


def test_batch_with_rows_out_of_sequence_order():
    run_and_check([Case(3, 1), Case(0, 5), Case(10, 1), Case(4, 6)], 4, 2, seed=3, shuffle=True)


def test_forward_writes_new_kv_into_the_pool():
    cases = [Case(2, 3), Case(5, 1)]
    kv, batch, keys, values = run_and_check(cases, 4, 2)
    for layer in range(LAYERS):
        for i, case in enumerate(cases):
            span = batch.seqs[i]
            for p in range(span.context_len):
                block, offset = span.block_table[p // kv.block_size], p % kv.block_size
                torch.testing.assert_close(kv.data[block, layer, 0, offset], keys[i][layer, p])
                torch.testing.assert_close(kv.data[block, layer, 1, offset], values[i][layer, p])


def test_forward_before_begin_is_an_error():
    kv = KVCache(KVShape(1, 1, 4, 4), 2, torch.float32, "cpu")
    with pytest.raises(AssertionError, match="begin"):
        TorchAttentionBackend().forward(0, torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), kv)
