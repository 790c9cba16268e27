"""Which kernels give a row other bits when other rows share its call: each kernel on a pool of
random rows, every row alone (one thread) against the same rows inside batches of other sizes
and at other places (two threads); prints the first batch size at which some row differs.

    kernel                          used by         first batch where a row differs
    dense x @ W (576 -> 960)        default         2
    panels (576 -> 960)             both            none
    ...

What deterministic mode runs must print "none" on every line (tests/model/test_batch_invariance.py
asserts it for those); the default mode's are listed for the record. Attention is probed by
tests/attention/test_query_backend.py (positions, not rows of one call).

    .venv/bin/python benchmarks/batch_invariance.py
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

POOL_ROWS = 100
BATCHES = (1, 2, 3, 7, 16, 33, 64, 100)
Rows = Callable[[torch.Tensor], torch.Tensor]


def first_variant_batch(fn: Rows, width: int, seed: int = 0) -> int | None:
    """The first batch size at which some row of a pool differs from itself computed alone (on
    one thread; the batches on two), or None."""
    pool = torch.randn(POOL_ROWS, width, generator=torch.Generator().manual_seed(seed))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([fn(pool[i:i + 1].clone()) for i in range(POOL_ROWS)])
        torch.set_num_threads(2)
        for size in BATCHES:
            for start in sorted({0, 5, POOL_ROWS - size}):
                if not torch.equal(fn(pool[start:start + size].clone()), alone[start:start + size]):
                    return size
        return None
    finally:
        torch.set_num_threads(threads)


def kernels() -> list[tuple[str, str, Rows, int]]:
    """(name, which mode runs it, the kernel on rows, row width)."""
    from pdserve.cpu.mkl_weights import MklPanels
    from pdserve.cpu.onednn_weights import OneDnnWeight
    from pdserve.cpu.panel_weights import load_row_panels
    from pdserve.model.layer_kernels import TorchKernels
    from pdserve.model.tiled_rows import CPU_TILE_ROWS, TiledRows
    from pdserve.native.layer_kernels import load_layer_kernels_library

    weight = torch.randn(576, 960, generator=torch.Generator().manual_seed(1)) * 0.05
    found: list[tuple[str, str, Rows, int]] = [
        ("dense x @ W (576 -> 960)", "default", lambda x: x @ weight, 576),
        ("fixed tiles of x @ W", "deterministic, no C", lambda x: TiledRows(weight, CPU_TILE_ROWS)(x, None), 576),
    ]
    onednn, mkl = OneDnnWeight.pack(weight), MklPanels.pack(weight)
    found += [("oneDNN packed (2+ rows)", "default", lambda x: onednn(torch.cat([x, x]), None)[:x.shape[0]], 576),
              ("MKL packed", "default", lambda x: mkl(x, None), 576)]
    panels = load_row_panels("cpu", torch.float32).kernel
    if panels is not None:
        packed = panels.pack(weight)
        found.append(("panels (C)", "both", lambda x: packed(x, None), 576))
    scale, reference, native = torch.randn(576), TorchKernels(), load_layer_kernels_library().kernel
    found.append(("RMS norm, torch", "both", lambda x: reference.rms_norm(x, scale, 1e-5), 576))
    if native is not None:
        found.append(("RMS norm, C", "both", lambda x: native.rms_norm(x, scale, 1e-5), 576))
    found += [("softmax (sampling)", "both", lambda x: torch.softmax(x, -1), 4096),
              ("log_softmax (logprobs)", "both", lambda x: torch.log_softmax(x, -1), 4096)]
    return found


def main() -> None:
    torch.manual_seed(0)
    print(f"{'kernel':<32}{'used by':<22}first batch where a row differs")
    for name, mode, fn, width in kernels():
        first = first_variant_batch(fn, width)
        print(f"{name:<32}{mode:<22}{'none' if first is None else first}", flush=True)


if __name__ == "__main__":
    main()
