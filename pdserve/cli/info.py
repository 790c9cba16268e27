"""`pdserve info`: what this machine serves a model with and the figures behind each choice: the
CPU and the kernels' build target, the projections' layout by row count with the rates the probe
measured, how many rows a decode step runs fused, and the calibration of the recompute-or-swap
cost model. Measures what this machine has not measured yet (kept beside the kernels)."""

from __future__ import annotations

import argparse
import subprocess

from pdserve.cli.options import add_engine_flags, engine_config


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="print the CPU paths chosen here for a model and the rates behind them")
    add_engine_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from pdserve.engine.engine import Engine

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(dataclasses.replace(engine_config(args), calibrate=True))
    for line in (*machine_lines(), *engine_lines(engine)):
        print(line)
    return 0


def machine_lines() -> list[str]:
    from pdserve.measurements import machine
    from pdserve.native.build import cache_dir, prebuilt_dir
    from pdserve.native.target import target

    m = machine()
    shipped = prebuilt_dir()
    return [f"cpu: {m['cpu']} ({m['cores']} cores, {m['arch']}), torch {m['torch']}",
            f"kernels: -march={target()} (the compiler reads native as {_native_target()}); "
            + (f"prebuilt {shipped}, then " if shipped else "") + f"cache {cache_dir()}"]


def engine_lines(engine) -> list[str]:
    import torch

    layout, model = engine.loaded.layout, engine.loaded.model
    fused = getattr(model, "fused_decode", None)
    lines = [f"model: {engine.loaded.source_path.name}, {torch.get_num_threads()} threads",
             f"projections: {layout}"]
    if layout.rates is not None:
        lines += _rates_lines(layout.rates, _macs(getattr(model, "layers", model)))
    if layout.head_rates is not None:
        lines += _rates_lines(layout.head_rates, _macs(model.lm_head), "head GFLOP/s")
    lines.append(f"decode steps fused: up to {fused.max_rows} rows" if fused and fused.max_rows
                 else "decode steps fused: no")
    kernel = engine.measured.decode_kernel
    if kernel is not None:
        lines.append(f"decode attention: {'the C kernel' if kernel.native_faster else 'sparse products'}")
        lines += ["  batch x context " + "".join(f"{f'{b}x{c}':>10}" for b, c in kernel.shapes),
                  "  C kernel ms     " + "".join(f"{s * 1e3:10.2f}" for s in kernel.native),
                  "  sparse ms       " + "".join(f"{s * 1e3:10.2f}" for s in kernel.sparse)]
    if engine.measured.fused is not None:
        t = engine.measured.fused
        lines += ["  rows     " + "".join(f"{b:>9}" for b in t.batches),
                  "  fused ms " + "".join(f"{s * 1e3:9.1f}" for s in t.fused),
                  "  layers ms" + "".join(f"{s * 1e3:9.1f}" for s in t.layers)]
    p = engine.measured.preemption
    lines.append(f"calibration: prefill {p.prefill_tokens_per_s:.0f} tokens/s, host link "
                 f"{p.host_link_bytes_per_s / 1e9:.2f} GB/s")
    return lines


def _macs(module) -> int:
    """Multiply-adds of one row through every projection of `module`."""
    from pdserve.model.layers import Linear

    return sum(m.weight.numel() for m in module.modules() if isinstance(m, Linear))


def _rates_lines(rates, macs: int, label: str = "GFLOP/s by rows") -> list[str]:
    lines = [f"  {label:<15} " + "".join(f"{r:>8}" for r in rates.rows)]
    for name in rates.seconds:
        lines.append(f"  {name:<15} " + "".join(f"{g:8.1f}" for g in rates.gflops(name, macs)))
    return lines


def _native_target() -> str:
    try:
        out = subprocess.run(["cc", "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (no cc)"
    return next((line.split()[-1] for line in out.splitlines() if line.strip().startswith("-march=")), "unknown")
