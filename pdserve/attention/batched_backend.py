"""Batched decode attention over the paged pool in place (CPU, float32/float64, or a half pool below
a float32 model); `torch-batched`.

A second implementation of the torch backend's contract, for passes dominated by decode tokens:

  * every one-token sequence of the pass, whatever its context length, read where its keys and
    values lie in the pool: by the C kernel of pdserve/native/paged_decode.py (float32; each key
    and value read once per layer; a half pool's widened as read), else in one sparse product per
    layer (pool_rows.py; float32/float64 pools), else (a half pool the kernel cannot read, or a
    windowed layer's decodes over one) as the reference gathers them; no per-layer gather of each
    sequence's K/V where the kernel or the products read them, no padding to the longest context;
  * each layer's new keys and values copied into the pool by that kernel's library where it
    runs (one copy per token from the projection's output, rounded into a half pool), else by
    KVCache.write;
  * every longer chunk exactly as the reference backend computes it (SDPA on the chunk, or on
    its context read from the pool), which is compute-bound and already runs at the matmul rate.

Layers with a window or another scale (LayerAttention) are planned apart: their chunks with the
reference's windowed masks, their decodes by sparse products listing only the window's positions
(the C kernel attends whole contexts at 1 / sqrt(head_dim) only, so it serves full layers alone).
A hybrid model's pool plans each layer group apart too: each reads and writes its own pages.

The reference (`torch`) backend stays the oracle; tests/attention/test_attention_batched.py
compares the two, and the engine tests compare both to transformers token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pdserve.attention.base import AttentionBackend, FULL_ATTENTION, LayerAttention, PlanKey, layer_keys, plan_keys
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.pool_rows import SUPPORTED_DTYPES, PoolRows, block_tables, plan_pool_rows, pool_attention
from pdserve.attention.selection import HALF_DTYPES
from pdserve.attention.torch_backend import Chunk, DecodeGroup, attend_chunk, attend_decode, plan_chunk, plan_decode
from pdserve.kv.kv_cache import KVCache
from pdserve.native.paged_decode import NativeDecode, NativePlan


@dataclass(frozen=True)
class _Decodes:
    rows: slice | torch.Tensor  # the decode tokens' rows of the flat batch, in sequence order
    seqs: tuple[SeqSpan, ...]  # planned into the pass's PoolRows once the head count is known


@dataclass
class _Plan:
    slot_mapping: dict[int, torch.Tensor]  # by layer group
    decodes: dict[int, _Decodes] | None  # by layer group
    chunks: dict[PlanKey, tuple[Chunk, ...]]  # by layer group and kind of layer
    num_tokens: int
    native: NativePlan | None = None  # the decodes' plan for the C kernel, when it runs them (full layers)
    native_writes: bool = False  # the C kernel's library copies K/V into the pool (slots checked)
    pools: dict[PlanKey, PoolRows] = field(default_factory=dict)  # else by group and kind, built on first use
    gathered: dict[PlanKey, DecodeGroup] = field(default_factory=dict)  # else (a half pool) the reference's
    all_full: bool = True  # every layer of the pass is FULL_ATTENTION, in one group


class BatchedTorchBackend(AttentionBackend):
    name = "torch-batched"

    def __init__(self, native: NativeDecode | None = None) -> None:
        """native: the C kernel for the decodes of float32 pools (None: the sparse products; set
        None later to stop using it, pdserve/attention/decode_kernel_probe.py)."""
        self.native = native
        self._plan: _Plan | None = None
        self._keys: tuple[PlanKey, ...] = ()  # each layer's (group, kind), set by begin

    def begin(self, batch: ForwardBatch, kv: KVCache, layers: Sequence[LayerAttention] = ()) -> None:
        if kv.data.dtype not in (*SUPPORTED_DTYPES, *HALF_DTYPES):
            raise ValueError(f"torch-batched attention reads a float32/float64/bfloat16/float16 KV pool, "
                             f"not {kv.data.dtype}")
        if not kv.data.is_contiguous():
            raise ValueError("torch-batched attention reads the KV pool as one contiguous tensor")
        device, dtype, size = kv.data.device, kv.data.dtype, kv.block_size
        self._keys = layer_keys(kv, layers)
        keys = plan_keys(self._keys)
        views = {g: batch.group(g) for g in dict.fromkeys(g for g, _ in keys)}
        chunks = {(g, kind): tuple(plan_chunk(s, size, device, dtype, kind) for s in views[g].seqs if s.query_len > 1)
                  for g, kind in keys}
        singles = {g: tuple(s for s in view.seqs if s.query_len == 1) for g, view in views.items()}
        rows = _rows([s.query_start for s in singles[0]], device) if singles[0] else None
        decodes = {g: _Decodes(rows, seqs) for g, seqs in singles.items()} if rows is not None else None
        native, writes, full = None, False, keys == ((0, FULL_ATTENTION),)
        if self.native is not None and self.native.serves(kv.data.dtype) and not kv.groups.windowed:
            native = plan_native_decodes(self.native, singles[0], kv) if singles[0] and (0, FULL_ATTENTION) in keys \
                else None
            writes = self.native.slots_problem(batch.slot_mapping, kv.data) is None  # else kv.write says what is wrong
        self._plan = _Plan({g: view.slot_mapping for g, view in views.items()}, decodes, chunks, batch.num_tokens,
                           native, writes, all_full=full)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: KVCache) -> torch.Tensor:
        plan = self._plan
        assert plan is not None, "begin() must be called before forward()"
        key = self._keys[layer]
        if plan.native_writes:
            self.native.write(kv.data, layer, plan.slot_mapping[0], k, v)
        else:
            kv.write(layer, plan.slot_mapping[key[0]], k, v)
        chunks = plan.chunks[key]
        if plan.decodes is None:
            return self._chunks_only(q, k, v, kv.layer(layer), chunks, plan.num_tokens)
        decodes = plan.decodes[key[0]]
        decoded = self._decode(layer, key, q, kv, plan, decodes)  # [B, H, D]
        if not chunks and _covers(decodes.rows, plan.num_tokens):
            return decoded
        out = torch.empty_like(q)
        out[decodes.rows] = decoded
        cache = kv.layer(layer)
        for chunk in chunks:
            out[chunk.rows] = attend_chunk(q, k, v, cache, chunk)
        return out

    def native_decode_pass(self) -> tuple[NativeDecode, NativePlan] | None:
        plan = self._plan
        if plan is None or plan.native is None or not plan.native_writes or not plan.all_full:
            return None
        if plan.chunks[(0, FULL_ATTENTION)]:
            return None
        return (self.native, plan.native) if _covers(plan.decodes[0].rows, plan.num_tokens) else None

    def _decode(self, layer: int, key: PlanKey, q: torch.Tensor, kv: KVCache, plan: _Plan,
                decodes: _Decodes) -> torch.Tensor:
        kind = key[1]
        if plan.native is not None and kind == FULL_ATTENTION:
            return self.native.attend(q[decodes.rows], kv.data, layer, plan.native)
        if kv.data.dtype not in SUPPORTED_DTYPES:  # a half pool: gathered and widened, as the reference does
            if key not in plan.gathered:
                plan.gathered[key] = plan_decode(list(decodes.seqs), kv.block_size, q.device, q.dtype, kind)
            return attend_decode(q, kv.layer(layer), plan.gathered[key])
        if key not in plan.pools:
            plan.pools[key] = plan_pool_rows(list(decodes.seqs), kv, q.shape[1], kind.window)
        return pool_attention(q[decodes.rows], kv, kv.slot(layer), plan.pools[key], kind.scale)

    @staticmethod
    def _chunks_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor,
                     chunks: tuple[Chunk, ...], num_tokens: int) -> torch.Tensor:
        if len(chunks) == 1 and _covers(chunks[0].rows, num_tokens):
            return attend_chunk(q, k, v, cache, chunks[0])
        out = torch.empty_like(q)
        for chunk in chunks:
            out[chunk.rows] = attend_chunk(q, k, v, cache, chunk)
        return out


def plan_native_decodes(native: NativeDecode, seqs: Sequence[SeqSpan], kv: KVCache) -> NativePlan:
    """The C kernel's plan for a pass's one-token sequences, in the order their outputs are wanted.
    Raises ValueError for a block table shorter than its context or naming a block outside the pool."""
    if any(len(s.block_table) * kv.block_size < s.context_len for s in seqs):
        raise ValueError("a decode sequence's block table is shorter than its context")
    lens = [s.context_len for s in seqs]
    return native.plan(block_tables(list(seqs), kv.block_size, max(lens)), lens, kv.data)


def _rows(starts: list[int], device: torch.device) -> slice | torch.Tensor:
    if starts == list(range(starts[0], starts[0] + len(starts))):
        return slice(starts[0], starts[0] + len(starts))
    return torch.tensor(starts, dtype=torch.long, device=device)


def _covers(rows: slice | torch.Tensor, num_tokens: int) -> bool:
    return isinstance(rows, slice) and rows.start == 0 and rows.stop == num_tokens
