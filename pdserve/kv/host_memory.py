"""Host memory for KV pools: zeroed tensors in their own huge-page mappings where Linux allows.

A KV pool is copied in large runs: by the UCX transport (the kernel pins and copies it page by
page between processes), by swap, and by the attention kernels. With 2 MiB pages instead of
4 KiB ones that page walk is 512 times shorter: on the development machine one UCX lane went
from 3.0 to 4.4 GB/s (benchmarks/kv_transfer.py). Linux in its default `madvise` mode gives huge
pages only to ranges that ask before they are first touched.

The pool gets an anonymous mapping of its own, aligned to a huge page inside it, so the advice
never reaches memory the allocator hands to anything else (advising the C heap would make every
later small allocation there fault in, and zero, a whole 2 MiB page). The tensor keeps the mapping
alive; it is unmapped when the last view of the pool goes.

NOTE: the mapping is zero by the kernel's contract and is not touched here: a page is committed
when first written. Writing the whole pool at start (as torch.zeros does) made every worker start
pay for memory it might never use, and with huge pages asked for, the kernel compacts memory to
find each one: 13 of a default decode worker's 18 s start went to its 3 GB of pools. The pool that
must not fault mid-transfer is pre-faulted by its UCX receiver (pdserve/transfer/ucx.py).
"""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE_BYTES = 2 << 20


def _advise_huge(region: mmap.mmap) -> bool:
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return False
    try:
        region.madvise(advice)
    except OSError:  # a kernel without transparent huge pages
        return False
    return True


def zeroed_host_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros on the CPU, like torch.zeros; at least a huge page big: in its own mapping, huge pages
    asked for, and no page committed until it is written."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE_PAGE_BYTES:
        return torch.zeros(shape, dtype=dtype)
    # Private: a shared anonymous mapping is shmem, which has huge pages only if shmem_enabled says so.
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _advise_huge(region)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds the mapping
    offset = -whole.data_ptr() % HUGE_PAGE_BYTES
    return whole[offset : offset + nbytes].view(dtype).view(shape)
