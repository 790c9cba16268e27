"""Fault a host buffer's pages in before transfers land in it, so the first ones do not pay for them.

madvise(MADV_POPULATE_WRITE) (Linux 5.14 and later) populates every page of a range in one call, as
a write would, leaving every byte as it was. The embedded model's default pool, 1.41 GiB, on a
2-core VM (benchmarks/prefault.py, medians of 5): in 4 KiB pages (no transparent huge pages)
0.46 s, where writing one byte per page took 2.24 s; in the pool's huge pages 0.13 s against 0.08.
Where the kernel lacks it, one byte per page is written with its own value, which is safe only
while nothing else writes the buffer.

`prefault_behind` does it off the start's path: madvise leaves every byte as it was, so it may
run on a thread of its own while the worker serves (a transfer landing meanwhile writes the pool
as it would anyway, and only pays its own faults); without madvise it touches at once. It asks
for BEHIND_PIECE_BYTES at a time: the kernel holds the process's memory map for a call's whole
range, so one call over the pool would hold up every mmap of the start's other threads (UCX's
worker, allocations) until it was done.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import threading
import time
from dataclasses import dataclass

import torch

_MADV_POPULATE_WRITE = 23  # linux/mman.h
BEHIND_PIECE_BYTES = 32 << 20

log = logging.getLogger(__name__)


def prefault(buffer: torch.Tensor) -> str:
    """Fault in the pages of a contiguous CPU tensor; how: "populate", "touch", or "none" (not on the CPU)."""
    if buffer.device.type != "cpu":
        return "none"
    if _populate(buffer.data_ptr(), buffer.numel() * buffer.element_size()):
        return "populate"
    flat = buffer.view(-1).view(torch.uint8)
    flat[::mmap.PAGESIZE] = flat[::mmap.PAGESIZE].clone()
    return "touch"


@dataclass(frozen=True)
class Behind:
    """A prefault under way, or done: `how` as `prefault` says it; `thread` the one faulting in
    (None: nothing runs behind)."""

    how: str
    thread: threading.Thread | None = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether every page is in (within `timeout_s`)."""
        if self.thread is not None:
            self.thread.join(timeout_s)
        return self.thread is None or not self.thread.is_alive()


def prefault_behind(buffer: torch.Tensor) -> Behind:
    """`prefault`, with madvise on a thread of its own (the first page now, to learn whether the
    kernel has it): "populate" under way (logged at INFO when done), else "touch" done now (no
    madvise here) or "none"."""
    if buffer.device.type != "cpu" or buffer.numel() == 0:
        return Behind("none")
    flat = buffer.view(-1).view(torch.uint8)
    if not _populate(flat.data_ptr(), 1):
        return Behind(prefault(buffer))
    thread = threading.Thread(target=_populate_all, args=(flat,), name="prefault", daemon=True)
    thread.start()
    return Behind("populate", thread)


def _populate_all(flat: torch.Tensor) -> None:
    started, address, nbytes = time.perf_counter(), flat.data_ptr(), flat.numel()
    for offset in range(0, nbytes, BEHIND_PIECE_BYTES):
        if not _populate(address + offset, min(BEHIND_PIECE_BYTES, nbytes - offset)):
            log.warning("faulting in the KV pool's %d MB failed at %d MB: transfers into the rest fault",
                        nbytes >> 20, offset >> 20)
            return
    log.info("faulted in the KV pool's %d MB in %.2f s, behind the start", flat.numel() >> 20,
             time.perf_counter() - started)


def _populate(address: int, nbytes: int) -> bool:
    if not sys.platform.startswith("linux") or nbytes == 0:
        return False
    start = address - address % mmap.PAGESIZE
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise(start, address + nbytes - start, _MADV_POPULATE_WRITE) == 0
