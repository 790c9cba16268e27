"""UCX settings a worker makes in its environment before UCX loads (no UCX import here).

Memory events: when libucs loads, UCX patches the process's mmap, munmap, brk and their kin
(`ucm_bistro_apply_patch_atomic`, a timed spin per function) so that its registration caches
learn when registered memory goes away: 0.4-0.5 s of every worker's first `import ucxx` on a
2-core VM, against 0.08 s without. Only memory that a transport registers needs them: RDMA
devices' (and a GPU's); TCP, shared memory and cma register nothing. So a worker whose KV pool
is in host memory, on a machine with no RDMA device, starts UCX without them; one with a device
keeps them, and an operator's UCX_MEM_EVENTS is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

RDMA_DEVICES = Path("/sys/class/infiniband")


def without_memory_events(environ: MutableMapping[str, str], pool_on_cpu: bool,
                          rdma_devices: Path = RDMA_DEVICES) -> bool:
    """Sets UCX_MEM_EVENTS=no in `environ` where nothing here needs them (above); whether it did."""
    if not pool_on_cpu or "UCX_MEM_EVENTS" in environ or _any(rdma_devices):
        return False
    environ["UCX_MEM_EVENTS"] = "no"
    return True


def _any(folder: Path) -> bool:
    try:
        return any(os.scandir(folder))
    except OSError:  # no such folder: no RDMA device
        return False
