"""Decode attention by the C kernel of paged_decode.c: each sequence's keys and values read from
the paged pool once per layer, the query heads of one KV head together (float32 queries; pools of
float32, bfloat16 or float16: `NativeDecode.serves(dtype)`, half pools widened as they are read).

The second implementation of the decode half of `torch-batched`, beside the sparse products of
pdserve/attention/pool_rows.py (which read every key once per query head). `load_native_decode()`
builds the kernel with the machine's C compiler at first use (loader.py); where that fails, the
backend keeps the sparse products. tests/native/test_paged_decode.py compares the two.

Every call takes the pool tensor itself, laid out as pdserve/kv/kv_cache.py has it:

    pool: [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim], contiguous
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.native.build import function_address
from pdserve.native.loader import Kernel, Loaded, load_kernel

PAGED_DECODE = Kernel("paged_decode.c", "decode attention kernel", "using the sparse products, slower decode")
THREADED_WORK = 1 << 16  # (sequence, KV head, position) triples from which the kernel uses threads
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGS = [_P, _P, _I, _P, _P, _I, _P] + [_I] * 7 + [ctypes.c_float] + [_I] * 2
_FROM_ARGS = [*_ARGS, _P]  # and each sequence's first position
_WRITE_ARGS = [_P, _P, _I, _P, _I, _P] + [_I] * 6
_SUFFIXES = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_f16"}  # the entry points' names by pool
_KIND_BITS = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 4}  # pdserve_paged_kv_kinds()'s bits


@dataclass(frozen=True)
class NativePlan:
    """One pass's decode sequences, valid for every layer."""

    tables: torch.Tensor  # [B, width] int64: each sequence's blocks, padded with its first
    lens: torch.Tensor  # [B] int64: context lengths
    max_len: int
    threads: int
    starts: torch.Tensor | None = None  # [B] int64: each sequence's first position (a window); None: 0


@dataclass(frozen=True)
class _EntryPoints:
    """The kernel's functions for one kind of pool."""

    decode: ctypes._CFuncPtr
    attend_from: ctypes._CFuncPtr
    write: ctypes._CFuncPtr


class NativeDecode:
    def __init__(self, library: ctypes.CDLL):
        self.library_name = Path(library._name).name  # names the source, compiler, flags and CPU it was built for
        kinds = library.pdserve_paged_kv_kinds
        kinds.argtypes, kinds.restype = [], ctypes.c_int
        served = kinds()
        self._entries = {dtype: _entry_points(library, suffix) for dtype, suffix in _SUFFIXES.items()
                         if served & _KIND_BITS[dtype]}

    def serves(self, dtype: torch.dtype) -> bool:
        """Whether the kernel reads and writes pools of `dtype` (float16: where it was compiled
        with _Float16)."""
        return dtype in self._entries

    def addresses(self, dtype: torch.dtype = torch.float32) -> dict[str, int]:
        """The attention and K/V copy's C addresses for pools of `dtype`, for a caller composing
        kernels in C (pdserve/cpu/fused_decode.py)."""
        entries = self._entries[dtype]
        return {"attend": function_address(entries.decode), "write_kv": function_address(entries.write)}

    def plan(self, tables: torch.Tensor, lens: list[int], pool: torch.Tensor,
             starts: list[int] | None = None) -> NativePlan:
        """tables: [B, width] int64, the blocks of each one-token sequence (in the order their
        outputs are wanted) padded to the widest; lens: their context lengths; starts: each one's
        first position (None: 0). Raises ValueError for tables the pool cannot hold (the kernel
        trusts the plan)."""
        blocks, block_size, kv_heads = pool.shape[0], pool.shape[3], pool.shape[4]
        if tables.shape[0] != len(lens) or tables.shape[1] * block_size < max(lens):
            raise ValueError("the block tables do not cover every decode sequence's context")
        if int(tables.min()) < 0 or int(tables.max()) >= blocks:
            raise ValueError(f"a block table names a block outside the pool's {blocks}")
        if starts is not None and any(not 0 <= s < n for s, n in zip(starts, lens)):
            raise ValueError("a sequence starts outside its context")
        threads = torch.get_num_threads() if sum(lens) * kv_heads >= THREADED_WORK else 1
        first = None if starts is None else torch.tensor(starts, dtype=torch.long)
        return NativePlan(tables, torch.tensor(lens, dtype=torch.long), max(lens), threads, first)

    def attend(self, q: torch.Tensor, pool: torch.Tensor, layer: int, plan: NativePlan,
               scale: float | None = None) -> torch.Tensor:
        """q: [B, H, D] (each sequence's heads contiguous; sequences may be strided) -> [B, H, D],
        each sequence attending its context in `layer` (the layer's place in a page: KVCache.slot)
        from its start, scores scaled by `scale` (None: 1 / sqrt(D))."""
        batch, heads, dim = q.shape
        if q.stride(2) != 1 or q.stride(1) != dim:
            q = q.contiguous()
        out = torch.empty(batch, heads, dim, dtype=q.dtype)
        _, layers, _, block_size, kv_heads, _ = pool.shape
        args = (pool.data_ptr(), q.data_ptr(), q.stride(0), out.data_ptr(), plan.tables.data_ptr(),
                plan.tables.shape[1], plan.lens.data_ptr(), batch, heads, kv_heads, dim, block_size,
                layers, layer, 1 / math.sqrt(dim) if scale is None else scale, plan.max_len, plan.threads)
        entries = self._entries[pool.dtype]
        status = entries.decode(*args) if plan.starts is None else entries.attend_from(*args, plan.starts.data_ptr())
        if status != 0:
            raise MemoryError("the decode attention kernel could not allocate its scratch or threads")
        return out

    @staticmethod
    def slots_problem(slot_mapping: torch.Tensor, pool: torch.Tensor) -> str | None:
        """Why `write` could not take these slots (the C copy trusts them), or None."""
        slots = pool.shape[0] * pool.shape[3]
        if slot_mapping.dtype != torch.long or not slot_mapping.is_contiguous() or slot_mapping.dim() != 1:
            return "the slot mapping is not one contiguous int64 row"
        if slot_mapping.numel() and (int(slot_mapping.min()) < 0 or int(slot_mapping.max()) >= slots):
            return f"a slot lies outside the pool's {slots}"
        return None

    def write(self, pool: torch.Tensor, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """KVCache.write's copy, from float32 k, v [T, Hkv, D] whose rows may be strided (views of
        the fused projection's output) into the pool's elements (a half pool rounds them to nearest,
        as torch converts), at slots `slots_problem` has passed."""
        _, layers, _, block_size, kv_heads, head_dim = pool.shape
        k, v = _rows(k), _rows(v)
        self._entries[pool.dtype].write(pool.data_ptr(), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                                        slot_mapping.data_ptr(), slot_mapping.numel(), kv_heads, head_dim, block_size,
                                        layers, layer)


def _entry_points(library: ctypes.CDLL, suffix: str) -> _EntryPoints:
    decode = getattr(library, f"pdserve_paged_decode{suffix}")
    decode.argtypes, decode.restype = _ARGS, ctypes.c_int
    attend_from = getattr(library, f"pdserve_paged_attend_from{suffix}")
    attend_from.argtypes, attend_from.restype = _FROM_ARGS, ctypes.c_int
    write = getattr(library, f"pdserve_write_kv{suffix}")
    write.argtypes, write.restype = _WRITE_ARGS, None
    return _EntryPoints(decode, attend_from, write)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, Hkv, D] with each token's heads contiguous (a copy where they are not)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def load_native_decode() -> Loaded[NativeDecode]:
    """The kernel, or None and why not (the fallback logged: loader.py)."""
    return load_kernel(PAGED_DECODE, NativeDecode)
