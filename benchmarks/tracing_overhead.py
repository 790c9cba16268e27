"""Decode tokens/s with tracing on against off, measured in one run.

Two identical services (1 prefill + 1 decode + router each) run side by side: one exports every
span over OTLP to a local receiver, the other has tracing off. Rounds alternate between them on
the same requests; the figure is the ratio of the median decode rates.

    .venv/bin/python benchmarks/tracing_overhead.py [--rounds 5] [--requests 4] [--tokens 48]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.streams import stream  # noqa: E402
from pdserve.cli.supervisor import Supervisor  # noqa: E402
from pdserve.procs.health import wait_serving  # noqa: E402
from pdserve.v1 import generation_pb2 as pb  # noqa: E402
from pdserve.v1 import generation_pb2_grpc  # noqa: E402
from tests.helpers.cluster import cluster_flags  # noqa: E402
from tests.helpers.otlp_receivers import GrpcReceiver  # noqa: E402

ENGINE = ["--threads", "1", "--kv-blocks", "256", "--host-kv-blocks", "16"]


def start(sup: Supervisor, tag: str, otlp: str | None) -> str:
    extra = [*(["--otlp-traces-endpoint", otlp] if otlp else []), *cluster_flags(sup.workdir)]
    workers = [sup.spawn(f"{role}-{tag}", [role, "--port", "0", *ENGINE, *extra]) for role in ("prefill", "decode")]
    p, d = (sup.wait_ready(w, 600) for w in workers)
    router = sup.spawn(f"router-{tag}", ["router", "--port", "0", "--prefill-workers", f"127.0.0.1:{p}",
                                         "--decode-workers", f"127.0.0.1:{d}", *extra])
    target = f"127.0.0.1:{sup.wait_ready(router, 600)}"
    wait_serving(target, 120)
    return target


def decode_rate(target: str, requests: int, tokens: int) -> float:
    """Tokens after the first, per second of decoding, summed over concurrent requests."""
    def one(i: int) -> float:
        request = pb.GenerateRequest(text=f"Request {i}: tell me about the sea.",
                                     sampling=pb.SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
        with grpc.insecure_channel(target) as channel:
            r = stream(generation_pb2_grpc.GenerationStub(channel), request, timeout=600)
        return (len(r.token_ids) - 1) / max(sum(r.gaps_s), 1e-9)

    with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        return sum(pool.map(one, range(requests)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    receiver = GrpcReceiver()
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "OTEL_BSP_SCHEDULE_DELAY": "200"})
    try:
        on, off = start(sup, "on", receiver.endpoint), start(sup, "off", None)
        decode_rate(on, 1, 4), decode_rate(off, 1, 4)  # warm up
        rates = {"on": [], "off": []}
        for _ in range(args.rounds):
            rates["on"].append(decode_rate(on, args.requests, args.tokens))
            rates["off"].append(decode_rate(off, args.requests, args.tokens))
        on_rate, off_rate = statistics.median(rates["on"]), statistics.median(rates["off"])
        print(f"load average {os.getloadavg()[0]:.1f}; spans received: {len(receiver.sink.spans)}")
        print(f"decode tokens/s, tracing on : {on_rate:.1f}  (rounds {[round(x, 1) for x in rates['on']]})")
        print(f"decode tokens/s, tracing off: {off_rate:.1f}  (rounds {[round(x, 1) for x in rates['off']]})")
        print(f"ratio on/off: {on_rate / off_rate:.3f} (target >= 0.95)")
    finally:
        sup.stop()
        receiver.stop()


if __name__ == "__main__":
    main()
