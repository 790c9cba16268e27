"""Decode attention read straight from the paged pool, as one sparse product per layer.

The pool is one contiguous tensor; seen as rows of head_dim values it is

    pool2d = data.view(-1, D):  row((block, layer, kv, t, h)) = (((block * NL + layer) * 2 + kv) * BS + t) * Hkv + h

so the key rows of layer l are the layer-0 key rows shifted by l * 2 * BS * Hkv, and the value
rows are the key rows shifted by BS * Hkv. One set of column indices (layer-0 keys) therefore
addresses K and V of every layer through a shifted 2-D view of the pool: nothing is gathered.

For the decode sequences of a pass (each one query token), with H query heads, G = H / Hkv:

    R = B * H rows, row (b, h) lists the pool rows of positions 0..context_len(b)-1 of KV head h // G
    scores = sampled_addmm(pattern, q [R, D], K_l^T)      one dot product per listed row (SDDMM)
    p      = softmax of each row's scores
    out    = embedding_bag(cols, V_l, per_sample_weights=p)  [R, D], a weighted sum of value rows

Both products read each key and value once per query head, from the pool in place; the G heads
of one KV head read the same rows back to back (they stay in cache). With an attention window W a
row lists only the last W positions of its sequence (positions context_len - W .. context_len - 1).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pdserve.attention.batch import SeqSpan
from pdserve.kv.kv_cache import KVCache

SUPPORTED_DTYPES = (torch.float32, torch.float64)  # sampled_addmm's CPU kernel computes no half types


@dataclass(frozen=True)
class PoolRows:
    """The sparse pattern of one pass's decode sequences, valid for every layer."""

    pattern: torch.Tensor  # CSR [R, window]: crow [R + 1], cols [nnz] (layer-0 key rows), values zero
    cols: torch.Tensor  # [nnz] int64, row-major over (sequence, query head, position)
    offsets: torch.Tensor  # [R] int64: start of each row's entries in cols
    valid: torch.Tensor | None  # [R, max_len] bool, True where a row lists a position; None: all rows full
    max_len: int  # positions spanned: from the first any row lists to the longest context
    layer_stride: int  # pool rows between one layer's keys and the next's
    value_shift: int  # pool rows between a key and its value
    window: int  # pool rows each layer's view spans


def plan_pool_rows(seqs: list[SeqSpan], kv: KVCache, num_heads: int, seen: int | None = None) -> PoolRows:
    """seqs: the pass's one-token sequences, in the order their outputs are wanted; seen: the
    attention window, the positions each query sees (None: its whole context)."""
    shape, block_size = kv.shape, kv.block_size
    kv_heads, device = shape.num_kv_heads, kv.data.device
    layer_stride = 2 * block_size * kv_heads
    block_stride = shape.num_layers * layer_stride
    lengths = torch.tensor([s.context_len for s in seqs])
    starts = lengths.sub(seen).clamp_(min=0) if seen is not None else torch.zeros_like(lengths)
    first, last = int(starts.min()), int(lengths.max())
    positions = torch.arange(first, last)
    tables = block_tables(seqs, block_size, last)  # [B, ceil(last / BS)]
    base = tables[:, positions // block_size] * block_stride + (positions % block_size) * kv_heads  # [B, L]
    heads = torch.arange(num_heads) // (num_heads // kv_heads)  # [H] -> its KV head
    rows = base[:, None, :] + heads[None, :, None]  # [B, H, L]
    full = bool((lengths == last).all() and (starts == first).all())
    listed = (positions[None, :] >= starts[:, None]) & (positions[None, :] < lengths[:, None])  # [B, L]
    valid = None if full else listed[:, None, :].expand_as(rows)
    cols = rows.reshape(-1) if valid is None else rows[valid]
    counts = (lengths - starts).repeat_interleave(num_heads)  # [R]
    crow = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    window = (kv.num_blocks - 1) * block_stride + block_size * kv_heads
    pattern = _csr(crow.to(device), cols.to(device), (len(counts), window), kv.data.dtype)
    return PoolRows(
        pattern=pattern,
        cols=cols.to(device),
        offsets=crow[:-1].to(device),
        valid=None if valid is None else valid.reshape(len(counts), last - first).to(device),
        max_len=last - first,
        layer_stride=layer_stride,
        value_shift=block_size * kv_heads,
        window=window,
    )


def pool_attention(q: torch.Tensor, kv: KVCache, layer: int, plan: PoolRows,
                   scale: float | None = None) -> torch.Tensor:
    """q: [B, H, D] -> [B, H, D], each sequence attending the positions `plan` lists in `layer`
    (the layer's place in a page: KVCache.slot), scores scaled by `scale` (None: 1 / sqrt(D))."""
    batch, num_heads, head_dim = q.shape
    pool = kv.data.view(-1, head_dim)
    start = layer * plan.layer_stride
    keys = pool[start : start + plan.window]  # [window, D]
    values = pool[start + plan.value_shift : start + plan.value_shift + plan.window]
    queries = q.reshape(batch * num_heads, head_dim)
    scores = torch.sparse.sampled_addmm(plan.pattern, queries, keys.t(), beta=0.0,
                                     alpha=1 / math.sqrt(head_dim) if scale is None else scale)
    weights = _row_softmax(scores.values(), plan)
    out = F.embedding_bag(plan.cols, values, plan.offsets, mode="sum", per_sample_weights=weights)  # [R, D]
    return out.view(batch, num_heads, head_dim)


def _row_softmax(scores: torch.Tensor, plan: PoolRows) -> torch.Tensor:
    """scores [nnz] in row order -> softmax within each row, same order."""
    if plan.valid is None:
        return torch.softmax(scores.view(-1, plan.max_len), dim=-1).view(-1)
    dense = scores.new_full(plan.valid.shape, float("-inf")).masked_scatter_(plan.valid, scores)
    return torch.softmax(dense, dim=-1)[plan.valid]


def block_tables(seqs: list[SeqSpan], block_size: int, max_len: int) -> torch.Tensor:
    """[B, ceil(max_len / BS)] int64, each row padded with its own first block (never read)."""
    width = -(-max_len // block_size)
    rows = [list(s.block_table[: -(-s.context_len // block_size)]) for s in seqs]
    return torch.tensor([r + [r[0]] * (width - len(r)) for r in rows], dtype=torch.long)


def _csr(crow: torch.Tensor, cols: torch.Tensor, size: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    values = torch.zeros(cols.shape[0], dtype=dtype, device=cols.device)
    with warnings.catch_warnings():  # "sparse CSR support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values, size=size, check_invariants=False)
