"""Fault a host buffer's pages in before transfers land in it, so the first ones do not pay for them.

madvise(MADV_POPULATE_WRITE) (Linux 5.14 and later) populates every page of a range in one call, as
a write would, leaving every byte as it was. The embedded model's default pool, 1.41 GiB, on a
2-core VM (benchmarks/prefault.py, medians of 5): in 4 KiB pages (no transparent huge pages)
0.46 s, where writing one byte per page took 2.24 s; in the pool's huge pages 0.13 s against 0.08.
Where the kernel lacks it, one byte per page is written with its own value, which is safe only
while nothing else writes the buffer.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

_MADV_POPULATE_WRITE = 23  # linux/mman.h


def prefault(buffer: torch.Tensor) -> str:
    """Fault in the pages of a contiguous CPU tensor; how: "populate", "touch", or "none" (not on the CPU)."""
    if buffer.device.type != "cpu":
        return "none"
    if _populate(buffer.data_ptr(), buffer.numel() * buffer.element_size()):
        return "populate"
    flat = buffer.view(-1).view(torch.uint8)
    flat[::mmap.PAGESIZE] = flat[::mmap.PAGESIZE].clone()
    return "touch"


def _populate(address: int, nbytes: int) -> bool:
    if not sys.platform.startswith("linux") or nbytes == 0:
        return False
    start = address - address % mmap.PAGESIZE
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise(start, address + nbytes - start, _MADV_POPULATE_WRITE) == 0
