"""Decode attention by the C kernel of paged_decode.c: each sequence's keys and values read from
the paged pool once per layer, the query heads of one KV head together (float32 pools).

The second implementation of the decode half of `torch-batched`, beside the sparse products of
pool_rows.py (which read every key once per query head). `NativeDecode.load()` builds the kernel
with the machine's C compiler at first use (native_build.py); where that fails, the backend keeps
the sparse products and says why once. tests/attention/test_native_decode.py compares the two.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.attention.batch import SeqSpan
from pdserve.attention.native_build import NativeBuildError, function_address, load_library
from pdserve.attention.pool_rows import block_tables
from pdserve.kv.kv_cache import KVCache

SOURCE = Path(__file__).with_name("paged_decode.c")
THREADED_WORK = 1 << 16  # (sequence, KV head, position) triples from which the kernel uses threads
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGS = [_P, _P, _I, _P, _P, _I, _P] + [_I] * 7 + [ctypes.c_float] + [_I] * 2
_WRITE_ARGS = [_P, _P, _I, _P, _I, _P] + [_I] * 6


@dataclass(frozen=True)
class NativePlan:
    """One pass's decode sequences, valid for every layer."""

    tables: torch.Tensor  # [B, width] int64: each sequence's blocks, padded with its first
    lens: torch.Tensor  # [B] int64: context lengths
    max_len: int
    threads: int


class NativeDecode:
    def __init__(self, library: ctypes.CDLL):
        self.library_name = Path(library._name).name  # names the source, compiler, flags and CPU it was built for
        self._kernel = library.pdserve_paged_decode
        self._kernel.argtypes = _ARGS
        self._kernel.restype = ctypes.c_int
        self._write = library.pdserve_write_kv
        self._write.argtypes = _WRITE_ARGS
        self._write.restype = None

    @classmethod
    def load(cls) -> NativeDecode:
        """Raises NativeBuildError when the kernel cannot be built or loaded here."""
        return cls(load_library(SOURCE))

    def addresses(self) -> dict[str, int]:
        """The attention and K/V copy's C addresses, for a caller composing kernels in C
        (pdserve/model/fused_decode.py)."""
        return {"attend": function_address(self._kernel), "write_kv": function_address(self._write)}

    def plan(self, seqs: list[SeqSpan], kv: KVCache) -> NativePlan:
        """seqs: the pass's one-token sequences, in the order their outputs are wanted. Raises
        ValueError for a block table the pool cannot hold (the kernel trusts the plan)."""
        size = kv.block_size
        lens = [s.context_len for s in seqs]
        if any(len(s.block_table) * size < s.context_len for s in seqs):
            raise ValueError("a decode sequence's block table is shorter than its context")
        tables = block_tables(seqs, size, max(lens))
        if int(tables.min()) < 0 or int(tables.max()) >= kv.num_blocks:
            raise ValueError(f"a block table names a block outside the pool's {kv.num_blocks}")
        work = sum(lens) * kv.shape.num_kv_heads
        threads = torch.get_num_threads() if work >= THREADED_WORK else 1
        return NativePlan(tables, torch.tensor(lens, dtype=torch.long), max(lens), threads)

    def attend(self, q: torch.Tensor, kv: KVCache, layer: int, plan: NativePlan) -> torch.Tensor:
        """q: [B, H, D] (each sequence's heads contiguous; sequences may be strided) -> [B, H, D],
        each sequence attending its whole context in `layer`."""
        batch, heads, dim = q.shape
        if q.stride(2) != 1 or q.stride(1) != dim:
            q = q.contiguous()
        out = torch.empty(batch, heads, dim, dtype=q.dtype)
        shape = kv.shape
        status = self._kernel(
            kv.data.data_ptr(), q.data_ptr(), q.stride(0), out.data_ptr(), plan.tables.data_ptr(),
            plan.tables.shape[1], plan.lens.data_ptr(), batch, heads, shape.num_kv_heads, dim, kv.block_size,
            shape.num_layers, layer, 1 / math.sqrt(dim), plan.max_len, plan.threads)
        if status != 0:
            raise MemoryError("the decode attention kernel could not allocate its scratch or threads")
        return out

    @staticmethod
    def slots_problem(slot_mapping: torch.Tensor, kv: KVCache) -> str | None:
        """Why `write` could not take these slots (the C copy trusts them), or None."""
        slots = kv.num_blocks * kv.block_size
        if slot_mapping.dtype != torch.long or not slot_mapping.is_contiguous() or slot_mapping.dim() != 1:
            return "the slot mapping is not one contiguous int64 row"
        if slot_mapping.numel() and (int(slot_mapping.min()) < 0 or int(slot_mapping.max()) >= slots):
            return f"a slot lies outside the pool's {slots}"
        return None

    def write(self, kv: KVCache, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """KVCache.write's copy for float32 pools, from k, v [T, Hkv, D] whose rows may be strided
        (views of the fused projection's output), at slots `slots_problem` has passed."""
        shape = kv.shape
        k, v = _rows(k), _rows(v)
        self._write(kv.data.data_ptr(), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), slot_mapping.data_ptr(),
                    slot_mapping.numel(), shape.num_kv_heads, shape.head_dim, kv.block_size, shape.num_layers, layer)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, Hkv, D] with each token's heads contiguous (a copy where they are not)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def load_native_decode() -> tuple[NativeDecode | None, str | None]:
    """The kernel, or None and why not."""
    try:
        return NativeDecode.load(), None
    except NativeBuildError as exc:
        return None, str(exc)
