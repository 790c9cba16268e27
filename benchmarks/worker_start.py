"""Worker start: what reading the model costs a worker that starts or restarts.

(a) The embedded model loaded in this process by gguf-py's path (GGUFReader, then
    gguf.quants.dequantize for every tensor: how the project loaded GGUF before) and by the
    project's own (pdserve/checkpoint/gguf_file.py + gguf_dequant.py, `load_model`), each
    `--repeats` times, medians reported; both models are checked equal parameter for parameter.
(b) A real `pdserve <role>` process for each of `--roles` (`--threads`, `--insecure`; `--kv-blocks`
    and `--transport` where given, else the worker's defaults) timed from spawn to its "serving"
    line, `--spawns` times: the import of torch and the rest are in it; the last start's lines
    logged at INFO are shown, each at its second since the spawn, with the worker's own phase log
    (pdserve/worker/start_phases.py). The first start on a machine builds the kernels, measures the
    layouts and keeps the dequantised weights (pdserve/model/weights_cache.py); later ones read all
    three. `--cold`: the first spawn of each role gets an empty PDSERVE_CACHE_DIR (a first start),
    the later ones that folder as it left it.

    .venv/bin/python benchmarks/worker_start.py [--repeats 2] [--spawns 2] [--threads 1]
        [--roles decode,prefill] [--no-load] [--cold] [--kv-blocks N] [--transport ucx|none]

The file is read once first so both paths find it in the page cache.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
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
PHASE_LOG = re.compile(r"^\w+ start [0-9.]+ s: ")  # pdserve/worker/startup.py's phase log


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


def worker_command(args: argparse.Namespace, role: str) -> list[str]:
    command = [sys.executable, "-m", "pdserve.cli.main", "--log-level", "INFO", role, "--port", "0",
               "--threads", str(args.threads), "--insecure"]
    if args.kv_blocks is not None:
        command += ["--kv-blocks", str(args.kv_blocks)]
    if args.transport is not None:
        command += ["--transport", args.transport]
    return command


def spawn_to_serving(command: list[str], cache: str | None, phases: list[tuple[float, str]]) -> float:
    """Seconds from spawning `command` to its "serving" line; `phases` gets each log line the
    worker printed before it, with its second since the spawn."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    if cache is not None:
        env["PDSERVE_CACHE_DIR"] = cache
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    said = []
    try:
        for line in process.stdout:
            if SERVING in line:
                return time.perf_counter() - started
            said.append(line)
            phases.append((time.perf_counter() - started, line.rstrip().split(" INFO ")[-1]))
        raise RuntimeError(f"{command[4]} exited ({process.wait()}) before serving: {''.join(said[-5:])}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def compare_loads(args: argparse.Namespace, path: Path) -> None:
    new_s, new = timed(lambda: load_model(None).model, args.repeats)
    old_s, old = timed(lambda: load_with_gguf_py(path), args.repeats)
    assert_same(old, new)
    print(f"load, gguf-py (GGUFReader + gguf.quants): {old_s:6.2f} s")
    print(f"load, pdserve (gguf_file + gguf_dequant): {new_s:6.2f} s   {old_s / new_s:.1f}x faster, same weights")


def time_role(args: argparse.Namespace, role: str) -> None:
    starts: list[list[tuple[float, str]]] = []
    spawns = []
    with tempfile.TemporaryDirectory(prefix="pdserve-cold-") as empty:
        for _ in range(args.spawns):
            starts.append([])
            spawns.append(spawn_to_serving(worker_command(args, role), empty if args.cold else None, starts[-1]))
    print(f"the last {role} start's lines (seconds since the spawn, at each line the worker logged):")
    for at, said in starts[-1]:
        print(f"  {at:6.2f}  {said[:110]}")
    shown = {"the first": starts[0]} if args.cold and len(starts) > 1 else {}
    shown["the last"] = starts[-1]
    for which, lines in shown.items():
        print_phases(f"{which} {role} start's", lines)
    first = " (the first with an empty cache)" if args.cold else ""
    print(f"pdserve {role}, spawn to serving: {statistics.median(spawns):6.2f} s   "
          f"(median of {args.spawns}{first}: {', '.join(f'{s:.2f}' for s in spawns)}; "
          f"later starts' median {statistics.median(spawns[1:] or spawns):.2f})")


def print_phases(whose: str, lines: list[tuple[float, str]]) -> None:
    for said in [said for _, said in lines if PHASE_LOG.match(said)][-1:]:
        print(f"{whose} phases (pdserve/start_phases.py), seconds:")
        for phase in said.split(": ", 1)[1].split(", "):
            print(f"  {phase}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2, help="loads by each path")
    p.add_argument("--spawns", type=int, default=2, help="worker processes started per role")
    p.add_argument("--threads", type=int, default=1, help="torch threads, here and in the workers")
    p.add_argument("--roles", default="decode", help="comma-separated: decode, prefill")
    p.add_argument("--kv-blocks", type=int, default=None, help="the workers' --kv-blocks (default: theirs)")
    p.add_argument("--transport", default=None, choices=["ucx", "none"], help="the workers' --transport")
    p.add_argument("--no-load", action="store_true", help="skip (a): only the worker starts")
    p.add_argument("--cold", action="store_true", help="each role's first spawn starts on an empty cache")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = embedded_model_path()
    path.read_bytes()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {path.name}; threads {args.threads}")
    if not args.no_load:
        compare_loads(args, path)
    for role in args.roles.split(","):
        time_role(args, role)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
