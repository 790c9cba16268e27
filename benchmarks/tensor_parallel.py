"""Tensor parallelism inside a worker: what a step's plan costs rank 0 (ForwardPlan from the
batch, pickled) and each follower (unpickled, the ForwardBatch rebuilt), and the decode step
time of an engine at each TP size.

    .venv/bin/python benchmarks/tensor_parallel.py --sizes 1,3 --batch 4 --steps 16 --threads 1

On a CPU with fewer cores than ranks x threads the ranks take turns and the step time says more
about the machine than about the split; the plan costs hold anywhere.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from pdserve.attention.batch import ForwardBatch, SeqSpan  # noqa: E402
from pdserve.config import CacheConfig, EngineConfig, SchedulerConfig  # noqa: E402
from pdserve.engine.engine import Engine  # noqa: E402
from pdserve.parallel.plan import ForwardPlan  # noqa: E402
from pdserve.requests import SamplingParams  # noqa: E402

PLAN_SHAPES = ((1, 8), (64, 64), (256, 128))  # decode sequences, blocks each
CPU = torch.device("cpu")


def plan_costs(repeats: int = 200) -> None:
    print("| decode batch | blocks per sequence | plan bytes | build + pickle (rank 0) | unpickle + rebuild (each follower) |")
    print("|---|---|---|---|---|")
    for seqs, blocks in PLAN_SHAPES:
        rows = torch.arange(seqs)
        spans = tuple(SeqSpan(i, 1, blocks * 16, tuple(range(i * blocks, (i + 1) * blocks))) for i in range(seqs))
        batch = ForwardBatch(rows, rows, rows, spans, rows)
        dump = _per_call(lambda: pickle.dumps(ForwardPlan.of(batch), protocol=pickle.HIGHEST_PROTOCOL), repeats)
        data = pickle.dumps(ForwardPlan.of(batch), protocol=pickle.HIGHEST_PROTOCOL)
        load = _per_call(lambda: pickle.loads(data).batch(CPU), repeats)
        print(f"| {seqs} | {blocks} | {len(data):,} | {dump * 1e6:.0f} us | {load * 1e6:.0f} us |")


def step_time(tp: int, model: str | None, batch: int, steps: int) -> float:
    """Seconds per decode step, `batch` sequences of a 64-token prompt, after their prefill."""
    config = EngineConfig(model=model, dtype="float32", attention_backend="torch", tensor_parallel_size=tp,
                          cache=CacheConfig(num_blocks=64, num_host_blocks=0),
                          scheduler=SchedulerConfig(token_budget=512, max_chunk_tokens=512))
    engine = Engine(config)
    try:
        sampling = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"r{i}", [1] + [100 + i] * 63, sampling)
        for _ in range(4):
            engine.step()
        started = time.perf_counter()
        for _ in range(steps):
            engine.step()
        return (time.perf_counter() - started) / steps
    finally:
        engine.loaded.ranks.close()


def _per_call(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,3", help="TP sizes (must divide the model's KV heads)")
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2 (3 KV heads)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch threads of each rank")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    plan_costs()
    print()
    print(f"| TP | decode step, batch {args.batch} (ms) |")
    print("|---|---|")
    for tp in (int(s) for s in args.sizes.split(",")):
        print(f"| {tp} | {step_time(tp, args.model, args.batch, args.steps) * 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
