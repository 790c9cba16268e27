"""Router start: seconds from spawning `pdserve router` to its ready file, and its RSS a second
later, `--spawns` times (no worker is reachable: the router starts without one). `--tree` runs
another checkout's code (e.g. a worktree of an earlier commit) with this interpreter.

    python benchmarks/router_start.py --spawns 3 [--tree DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def spawn_once(tree: Path) -> tuple[float, float, bool]:
    """(seconds to ready, RSS in MB, whether a torch library is mapped) of one router process."""
    ready = Path(tempfile.mkdtemp()) / "ready"
    argv = [sys.executable, "-m", "pdserve.cli.main", "router", "--port", "0", "--prefill-workers", "127.0.0.1:1",
            "--decode-workers", "127.0.0.1:2", "--insecure", "--ready-file", str(ready)]
    start = time.monotonic()
    process = subprocess.Popen(argv, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(f"the router exited with {process.returncode}")
            time.sleep(0.01)
        seconds = time.monotonic() - start
        time.sleep(1.0)
        status = Path(f"/proc/{process.pid}/status").read_text()
        rss_kb = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
        torch = "libtorch" in Path(f"/proc/{process.pid}/maps").read_text()
        return seconds, rss_kb / 1024, torch
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=REPO)
    args = parser.parse_args()
    runs = [spawn_once(args.tree) for _ in range(args.spawns)]
    seconds, rss = [r[0] for r in runs], [r[1] for r in runs]
    print(f"{args.tree}: ready {statistics.median(seconds):.2f} s median ({', '.join(f'{s:.2f}' for s in seconds)}); "
          f"RSS {statistics.median(rss):.0f} MB median ({', '.join(f'{r:.0f}' for r in rss)}); "
          f"torch mapped: {any(r[2] for r in runs)}; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
