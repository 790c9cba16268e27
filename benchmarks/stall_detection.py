"""How long a stream waits when its decode worker is SIGSTOPped: 1 prefill + 2 decode workers and a
router; one greedy stream; the decode worker running it is stopped right after its first token;
printed: the stream's largest gap between tokens (the router's keepalive finds the stalled worker,
the stream resumes on the other) and where it fell.

    PYTHONPATH=. .venv/bin/python benchmarks/stall_detection.py [--tokens 300]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.client import Client, ClientOptions  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402
from tests.helpers.worker_stats import worker_stats  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=300)
    args = ap.parse_args()
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    secured = cluster_flags(sup.workdir)
    try:
        children = {name: sup.spawn(name, [role, "--port", "0", *ENGINE, *secured])
                    for name, role in (("P", "prefill"), ("D1", "decode"), ("D2", "decode"))}
        ports = {name: sup.wait_ready(child, 240) for name, child in children.items()}
        router = sup.spawn("router", ["router", "--port", "0", "--prefill-workers", f"127.0.0.1:{ports['P']}",
                                      "--decode-workers", f"127.0.0.1:{ports['D1']},127.0.0.1:{ports['D2']}",
                                      *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(target, 60)
        with Client(target, ClientOptions(timeout_s=600)) as client:
            chunks = iter(client.stream("Tell me a long story about the sea.", max_tokens=args.tokens, temperature=0,
                                        ignore_eos=True))
            next(chunks)
            times = [time.monotonic()]
            victim = None
            while victim is None:
                victim = next((n for n in ("D1", "D2")
                               if worker_stats(f"127.0.0.1:{ports[n]}", "decode").requests_running), None)
            stopped = time.monotonic()
            os.killpg(children[victim].process.pid, signal.SIGSTOP)
            try:
                times += [time.monotonic() for _ in chunks]
            finally:
                os.killpg(children[victim].process.pid, signal.SIGCONT)
        gaps = [b - a for a, b in zip(times, times[1:])]
        worst = max(range(len(gaps)), key=gaps.__getitem__)
        print(f"decode worker {victim} stopped; largest gap {gaps[worst]:.2f} s, beginning "
              f"{times[worst] - stopped:+.2f} s from the SIGSTOP; {len(times)} token messages")
    finally:
        sup.stop()


if __name__ == "__main__":
    main()
