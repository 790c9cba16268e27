"""One-shot check of pdserve on a machine with a GPU; prints one table and exits (1 when a check
failed or raised, else 0; without CUDA one line and 0).

    defaults     what --dtype auto and --attention-backend auto give on this GPU
    attention    flashinfer against the torch backend on the same mixed batch (Llama-3-8B heads)
    half         the embedded model in the GPU default dtype against float32, greedy
    swap         a tight KV pool swapping to pinned host memory (tokens equal), and the raw copies
    tp           tensor parallel 2 against 1 (needs two GPUs)
    decode       decode step time at Llama-3-8B's sizes (random weights) against the memory bound
    deterministic  --deterministic: requests alone against together, chunked, bitwise equal

    .venv/bin/python benchmarks/gpu_check.py                 # everything, on cuda
    .venv/bin/python benchmarks/gpu_check.py --skip decode   # leave out checks by name
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.gpu.common import Row, Verdict, progress, release_memory  # noqa: E402

NO_CUDA = "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check"


def defaults_rows(device: torch.device) -> list[Row]:
    from pdserve.attention.selection import choose_backend, flashinfer_problem
    from pdserve.model.dtypes import serving_dtype

    dtype = serving_dtype("auto", device)
    choice = choose_backend("auto", device.type, flashinfer_problem(device, dtype), dtype)
    result = f"{str(dtype).removeprefix('torch.')} with {choice.name}"
    if choice.fallback:
        return [Row("defaults: --dtype auto, --attention-backend auto", f"{result}: {choice.fallback}", Verdict.WARN)]
    return [Row("defaults: --dtype auto, --attention-backend auto", result, Verdict.OK)]


def _attention(device: torch.device) -> list[Row]:
    from benchmarks.gpu.attention import attention_rows

    return attention_rows(device)


def _half(device: torch.device) -> list[Row]:
    from benchmarks.gpu.engine_checks import half_row

    return [half_row(device)]


def _swap(device: torch.device) -> list[Row]:
    from benchmarks.gpu.engine_checks import swap_row
    from benchmarks.gpu.swap_copy import swap_copy_row

    return [swap_row(device), swap_copy_row(device)]


def _tp(device: torch.device) -> list[Row]:
    from benchmarks.gpu.engine_checks import tensor_parallel_row

    return [tensor_parallel_row(device)]


def _decode(device: torch.device) -> list[Row]:
    from benchmarks.gpu.decode_bound import decode_rows

    return decode_rows(device)


def _deterministic(device: torch.device) -> list[Row]:
    from benchmarks.gpu.deterministic import deterministic_row

    return [deterministic_row(device)]


CHECKS: dict[str, Callable[[torch.device], list[Row]]] = {
    "defaults": defaults_rows, "attention": _attention, "half": _half, "swap": _swap, "tp": _tp, "decode": _decode,
    "deterministic": _deterministic,
}


def guarded(name: str, check: Callable[[torch.device], list[Row]], device: torch.device) -> list[Row]:
    """The check's rows, or one ERROR row when it raised (its traceback on stderr)."""
    progress(f"{name} ...")
    try:
        return check(device)
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' rows
        traceback.print_exc(file=sys.stderr)
        return [Row(name, f"{type(exc).__name__}: {exc}", Verdict.ERROR)]
    finally:
        release_memory(device)


def machine_line(device: torch.device) -> str:
    props = torch.cuda.get_device_properties(device)
    try:
        flashinfer = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        flashinfer = "not installed"
    return (f"{props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}), "
            f"{torch.cuda.device_count()} GPU(s); torch {torch.__version__} (CUDA {torch.version.cuda}); "
            f"flashinfer {flashinfer}")


def table(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  {'verdict':<7}  result", f"{'-' * width}  {'-' * 7}  {'-' * 6}"]
    return "\n".join(lines + [f"{r.check:<{width}}  {r.verdict.value:<7}  {r.result}" for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="the GPU to check (default: cuda, the current one)")
    parser.add_argument("--skip", default="", help=f"comma-separated checks to leave out: {', '.join(CHECKS)}")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    skipped = {name for name in args.skip.split(",") if name}
    if skipped - set(CHECKS):
        parser.error(f"unknown checks {sorted(skipped - set(CHECKS))}; choose from {', '.join(CHECKS)}")
    device = torch.device(args.device)
    rows = [row for name, check in CHECKS.items() if name not in skipped for row in guarded(name, check, device)]
    print(machine_line(device))
    print(table(rows), flush=True)
    return 1 if any(r.verdict in (Verdict.FAIL, Verdict.ERROR) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
