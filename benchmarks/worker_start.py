"""Worker start: what reading the model costs a worker that starts or restarts.

(a) The embedded model loaded in this process by gguf-py's path (GGUFReader, then
    gguf.quants.dequantize for every tensor: how the project loaded GGUF before) and by the
    project's own (pdserve/checkpoint/gguf_file.py + gguf_dequant.py, `load_model`), each
    `--repeats` times, medians reported; both models are checked equal parameter for parameter.
(b) A real `pdserve decode` process (`--threads`, `--kv-blocks`, no KV transport, --insecure) timed from
    spawn to its "serving" line, `--spawns` times: the import of torch and the rest are in it; the
    last start's phases are the lines it logged at INFO, each at its second since the spawn (the
    first start on a machine builds the kernels, measures the layouts and keeps the dequantised
    weights, pdserve/model/weights_cache.py; later ones read all three: pass an empty
    PDSERVE_CACHE_DIR to see a first start).

    .venv/bin/python benchmarks/worker_start.py [--repeats 2] [--spawns 2] [--threads 1]

The file is read once first so both paths find it in the page cache.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pdserve.model import load_model  # noqa: E402
from pdserve.checkpoint.embedded import embedded_model_path  # noqa: E402
from pdserve.checkpoint.gguf_config import hf_name  # noqa: E402
from pdserve.model.gguf_loader import unpermute_rows  # noqa: E402
from pdserve.checkpoint.source import read_model_config  # noqa: E402
from pdserve.model.weights import build_model  # noqa: E402

SERVING = "serving on"


def load_with_gguf_py(path: Path) -> torch.nn.Module:
    """The embedded model as gguf-py reads and dequantises it (the config, a fraction of a
    second, comes from the project's reader)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    config = read_model_config(str(path))
    tensors = {hf_name(t.name): t for t in GGUFReader(str(path)).tensors}

    def fetch(name: str) -> torch.Tensor:
        tensor = tensors[name]
        weight = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
        if name.split(".")[-2] in ("q_proj", "k_proj"):
            return unpermute_rows(weight, weight.shape[0] // config.head_dim)
        return weight

    return build_model(config, fetch, str(path), "cpu", torch.float32)


def timed(load, repeats: int) -> tuple[float, torch.nn.Module]:
    seconds, model = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        model = load()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), model


def assert_same(old: torch.nn.Module, new: torch.nn.Module) -> None:
    theirs, ours = old.state_dict(), new.state_dict()
    assert theirs.keys() == ours.keys()
    different = [name for name in ours if not torch.equal(theirs[name], ours[name])]
    assert not different, f"the two paths load different weights: {different[:3]}"


def spawn_to_serving(args: argparse.Namespace, phases: list[tuple[float, str]]) -> float:
    """Seconds from spawning `pdserve decode` to its "serving" line; `phases` gets each log line
    the worker printed before it, with its second since the spawn."""
    command = [sys.executable, "-m", "pdserve.cli.main", "--log-level", "INFO", "decode", "--port", "0",
               "--threads", str(args.threads), "--kv-blocks", str(args.kv_blocks), "--transport", "none", "--insecure"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    said = []
    try:
        for line in process.stdout:
            if SERVING in line:
                return time.perf_counter() - started
            said.append(line)
            phases.append((time.perf_counter() - started, line.rstrip().split(" INFO ")[-1][:110]))
        raise RuntimeError(f"pdserve decode exited ({process.wait()}) before serving: {''.join(said[-5:])}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2, help="loads by each path")
    p.add_argument("--spawns", type=int, default=2, help="decode processes started")
    p.add_argument("--threads", type=int, default=1, help="torch threads, here and in the decode process")
    p.add_argument("--kv-blocks", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = embedded_model_path()
    path.read_bytes()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {path.name}; threads {args.threads}")
    new_s, new = timed(lambda: load_model(None).model, args.repeats)
    old_s, old = timed(lambda: load_with_gguf_py(path), args.repeats)
    assert_same(old, new)
    print(f"load, gguf-py (GGUFReader + gguf.quants): {old_s:6.2f} s")
    print(f"load, pdserve (gguf_file + gguf_dequant): {new_s:6.2f} s   {old_s / new_s:.1f}x faster, same weights")
    phases: list[tuple[float, str]] = []
    spawns = []
    for _ in range(args.spawns):
        phases.clear()
        spawns.append(spawn_to_serving(args, phases))
    print("the last start's phases (seconds since the spawn, at each line the worker logged):")
    for at, said in phases:
        print(f"  {at:6.2f}  {said}")
    print(f"pdserve decode, spawn to serving:         {statistics.median(spawns):6.2f} s   "
          f"(median of {args.spawns}: {', '.join(f'{s:.2f}' for s in spawns)})")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
