"""Reference attention on torch's scaled_dot_product_attention; runs on CPU and GPU.

The pass is split into two kinds of work, planned once in `begin`:

  * the 1-token sequences (decodes, 1-token chunks) in padded SDPA calls, one per group of
    similar context lengths (block counts within a power of two, so one long context does not
    pad every short one): block tables gathered to [B, max_blocks * block_size] keys, padding
    masked out. GQA is folded into the query length (the G query heads of one KV head act as G
    queries at the same position), so no KV head is ever repeated;
  * every longer chunk alone: a fresh prompt (context == chunk) attends its own k/v with
    `is_causal`; a chunk after a cached prefix reads its whole context from the pool with a
    bottom-right causal mask.

A layer with a window (LayerAttention) gets its own plan, the same work with masks that also hide
the positions before its window; a pass plans once per kind of layer it holds, and per layer
group of a hybrid model's pool (each group reads its own pages: ForwardBatch.group). A pool of
another dtype than the queries (a half pool below a float32 model) is read widened to theirs, the
masks too; a fresh prompt attends its own k/v as the pool holds them (rounded), so that it
computes the same in one chunk or in several.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pdserve.attention.base import AttentionBackend, FULL_ATTENTION, LayerAttention, PlanKey, layer_keys, plan_keys
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.kv.kv_cache import KVCache

Rows = slice | torch.Tensor


@dataclass(frozen=True)
class DecodeGroup:
    rows: Rows  # B flat-batch rows, one per sequence
    block_table: torch.Tensor  # [B, max_blocks] int64, padded with block 0
    mask: torch.Tensor  # [B, 1, 1, max_blocks * block_size] additive: 0 or -inf
    scale: float | None = None  # None: SDPA's 1 / sqrt(head_dim)


@dataclass(frozen=True)
class Chunk:
    rows: slice  # the chunk's query_len rows
    context_len: int
    blocks: torch.Tensor | None  # [ceil(context_len / block_size)]; None: fresh prompt, own k/v
    mask: torch.Tensor | None  # [query_len, context_len] additive, bottom-right causal (and windowed); None: causal
    scale: float | None = None  # None: SDPA's 1 / sqrt(head_dim)


@dataclass(frozen=True)
class _Plan:
    slot_mapping: torch.Tensor
    decodes: tuple[DecodeGroup, ...]
    chunks: tuple[Chunk, ...]
    covers_all: bool  # one piece of work holds every row: return its output as is


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self._plans: dict[PlanKey, _Plan] = {}
        self._keys: tuple[PlanKey, ...] = ()  # each layer's (group, kind), set by begin

    def begin(self, batch: ForwardBatch, kv: KVCache, layers: Sequence[LayerAttention] = ()) -> None:
        self._keys = layer_keys(kv, layers)
        self._plans = {(g, kind): _plan(batch.group(g), kv, kind) for g, kind in plan_keys(self._keys)}

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        assert self._plans, "begin() must be called before forward()"
        plan = self._plans[self._keys[layer]]
        kv.write(layer, plan.slot_mapping, k, v)
        cache = kv.layer(layer)  # [num_blocks, 2, block_size, kv_heads, head_dim]
        if plan.covers_all and plan.decodes:
            return attend_decode(q, cache, plan.decodes[0])
        if plan.covers_all:
            return attend_chunk(q, k, v, cache, plan.chunks[0])
        out = torch.empty_like(q)
        for group in plan.decodes:
            out[group.rows] = attend_decode(q, cache, group)
        for chunk in plan.chunks:
            out[chunk.rows] = attend_chunk(q, k, v, cache, chunk)
        return out


def _plan(batch: ForwardBatch, kv: KVCache, kind: LayerAttention) -> _Plan:
    device, dtype, size = kv.data.device, kv.data.dtype, kv.block_size
    singles = [s for s in batch.seqs if s.query_len == 1]
    decodes = tuple(plan_decode(group, size, device, dtype, kind) for group in _by_length(singles, size))
    chunks = tuple(plan_chunk(s, size, device, dtype, kind) for s in batch.seqs if s.query_len > 1)
    covers_all = len(chunks) + len(decodes) == 1 and _rows_cover(decodes, chunks, batch.num_tokens)
    return _Plan(batch.slot_mapping, decodes, chunks, covers_all)


def _by_length(seqs: list[SeqSpan], block_size: int) -> list[list[SeqSpan]]:
    """Groups whose block counts share a power-of-two bucket (1, 2-3, 4-7, ...), in batch order."""
    groups: dict[int, list[SeqSpan]] = {}
    for seq in seqs:
        groups.setdefault(_blocks(seq, block_size).bit_length(), []).append(seq)
    return list(groups.values())


def _blocks(seq: SeqSpan, block_size: int) -> int:
    return -(-seq.context_len // block_size)


def plan_decode(seqs: list[SeqSpan], block_size: int, device: torch.device, dtype: torch.dtype,
                kind: LayerAttention) -> DecodeGroup:
    max_blocks = max(_blocks(s, block_size) for s in seqs)
    table = torch.zeros((len(seqs), max_blocks), dtype=torch.long)
    for i, s in enumerate(seqs):
        used = s.block_table[: _blocks(s, block_size)]
        table[i, : len(used)] = torch.tensor(used, dtype=torch.long)
    lengths = torch.tensor([s.context_len for s in seqs])[:, None]  # [B, 1]: the query sits at length - 1
    visible = _visible(torch.arange(max_blocks * block_size)[None, :], lengths - 1, kind.window)  # [B, L]
    mask = _additive(visible, dtype)[:, None, None, :]
    rows = _as_rows([s.query_start for s in seqs])
    return DecodeGroup(_to(rows, device), table.to(device), mask.to(device), kind.scale)


def plan_chunk(seq: SeqSpan, block_size: int, device: torch.device, dtype: torch.dtype,
               kind: LayerAttention = FULL_ATTENTION) -> Chunk:
    rows = slice(seq.query_start, seq.query_start + seq.query_len)
    fresh = seq.context_len == seq.query_len
    if fresh and (kind.window is None or kind.window >= seq.context_len):
        return Chunk(rows, seq.context_len, None, None, kind.scale)
    first = seq.context_len - seq.query_len
    query_pos = torch.arange(first, seq.context_len)[:, None]  # [Q, 1]
    visible = _visible(torch.arange(seq.context_len)[None, :], query_pos, kind.window)  # [Q, C]
    used = seq.block_table[: _blocks(seq, block_size)]
    blocks = None if fresh else torch.tensor(used, dtype=torch.long, device=device)
    return Chunk(rows, seq.context_len, blocks, _additive(visible, dtype).to(device), kind.scale)


def _visible(key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Broadcast key and query positions -> True where the key is causal (and within the window)."""
    causal = key_pos <= query_pos
    return causal if window is None else causal & (key_pos > query_pos - window)


def attend_decode(q: torch.Tensor, cache: torch.Tensor, group: DecodeGroup) -> torch.Tensor:
    batch, num_heads, head_dim = group.block_table.shape[0], q.shape[1], q.shape[2]
    kv_heads = cache.shape[3]
    keys = _gather(cache[:, 0], group.block_table).view(batch, -1, kv_heads, head_dim).transpose(1, 2)  # [B, Hkv, L, D]
    values = _gather(cache[:, 1], group.block_table).view(batch, -1, kv_heads, head_dim).transpose(1, 2)
    queries = q[group.rows].view(batch, kv_heads, num_heads // kv_heads, head_dim)  # [B, Hkv, G, D]
    out = F.scaled_dot_product_attention(queries, keys.to(q.dtype), values.to(q.dtype),
                                         attn_mask=group.mask.to(q.dtype), scale=group.scale)  # [B, Hkv, G, D]
    return out.reshape(batch, num_heads, head_dim)


def attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, chunk: Chunk) -> torch.Tensor:
    queries = q[chunk.rows].transpose(0, 1)[None]  # [1, H, Q, D]
    if chunk.blocks is None:
        keys, values = (_as_stored(x[chunk.rows], cache.dtype) for x in (k, v))  # [C, Hkv, D]
    else:
        kv_heads, head_dim = cache.shape[3], cache.shape[4]
        keys = _gather(cache[:, 0], chunk.blocks).view(-1, kv_heads, head_dim)[: chunk.context_len].to(q.dtype)
        values = _gather(cache[:, 1], chunk.blocks).view(-1, kv_heads, head_dim)[: chunk.context_len].to(q.dtype)
    out = F.scaled_dot_product_attention(
        queries,
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        attn_mask=None if chunk.mask is None else chunk.mask.to(q.dtype),
        is_causal=chunk.mask is None,
        scale=chunk.scale,
        enable_gqa=True,
    )  # [1, H, Q, D]
    return out[0].transpose(0, 1)


def _as_stored(x: torch.Tensor, pool: torch.dtype) -> torch.Tensor:
    """`x` as a pool of `pool` holds it: rounded there and widened back where the pool is narrower
    (so a prompt attends the same values in one chunk or in several)."""
    return x if pool == x.dtype else x.to(pool).to(x.dtype)


def _gather(pool: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """pool [num_blocks, block_size, Hkv, D] (K or V of one layer), blocks [...] -> [..., block_size, Hkv, D]."""
    return pool.index_select(0, blocks.flatten()).view(*blocks.shape, *pool.shape[1:])


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))


def _as_rows(starts: list[int]) -> Rows:
    if starts == list(range(starts[0], starts[0] + len(starts))):
        return slice(starts[0], starts[0] + len(starts))
    return torch.tensor(starts, dtype=torch.long)


def _to(rows: Rows, device: torch.device) -> Rows:
    return rows if isinstance(rows, slice) else rows.to(device)


def _rows_cover(decodes: tuple[DecodeGroup, ...], chunks: tuple[Chunk, ...], num_tokens: int) -> bool:
    rows = decodes[0].rows if decodes else chunks[0].rows
    return isinstance(rows, slice) and rows.start == 0 and rows.stop == num_tokens
