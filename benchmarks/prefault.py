"""What faulting in a KV pool's pages costs a decode worker at start (its UCX receiver does it, so
that the first transfers do not): one byte written per page, against madvise(MADV_POPULATE_WRITE),
each on a fresh buffer the size of the embedded model's default pool (2,048 blocks of 16 tokens),
`--repeats` times in one run, medians and their ratio; for a buffer of 4 KiB pages (torch.empty:
a machine without transparent huge pages) and for the pool's own memory (pdserve/kv/host_memory.py,
huge pages asked for), the two ways alternating which goes first.

    .venv/bin/python benchmarks/prefault.py [--blocks 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mmap  # noqa: E402

import torch  # noqa: E402

from pdserve.kv.host_memory import zeroed_host_tensor  # noqa: E402
from pdserve.transfer.prefault import prefault  # noqa: E402

BLOCK_NBYTES = 30 * 2 * 3 * 64 * 16 * 4  # SmolLM2-135M: layers x (K, V) x KV heads x head dim x tokens x fp32


def _touch(buffer: torch.Tensor) -> str:
    flat = buffer.view(-1)
    flat[::mmap.PAGESIZE] = flat[::mmap.PAGESIZE].clone()
    return "touch"


def _timed(fault, memory, nbytes: int) -> tuple[float, str]:
    buffer = memory(nbytes)
    start = time.perf_counter()
    how = fault(buffer)
    return time.perf_counter() - start, how


MEMORY = {"4 KiB pages": lambda n: torch.empty(n, dtype=torch.uint8),
          "the pool's own": lambda n: zeroed_host_tensor((n,), torch.uint8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    nbytes = args.blocks * BLOCK_NBYTES
    print(f"pool {nbytes / 2**30:.2f} GiB ({args.blocks} blocks), {args.repeats} runs each, medians")
    for name, memory in MEMORY.items():
        runs: dict[str, list[float]] = {"touch": [], "prefault": []}
        how = ""
        for i in range(args.repeats):
            ways = [("touch", _touch), ("prefault", prefault)]
            for way, fault in ways if i % 2 == 0 else ways[::-1]:
                seconds, done = _timed(fault, memory, nbytes)
                runs[way].append(seconds)
                how = done if way == "prefault" else how
        touch, fast = statistics.median(runs["touch"]), statistics.median(runs["prefault"])
        print(f"{name}: one byte per page {touch:6.3f} s, prefault ({how}) {fast:6.3f} s, ratio {touch / fast:.2f}x")


if __name__ == "__main__":
    main()
