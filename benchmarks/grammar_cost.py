"""What structured output costs a worker's decode step: the embedded model decoding a batch of
requests, every one under a JSON schema against none, in one run. For each batch size: the mean
decode step unconstrained and constrained, the part of the constrained step spent waiting for the
masks after the forward pass (their computation overlaps it on a thread) and applying them to the
logits, and the ratio. The issue's bound: at batch 64, masks cost at most 10% of the step.

Both runs decode the same prompts for the same number of steps (ignore_eos off: a schema that
allows long strings, so no request ends early; max_tokens caps both).

    PYTHONPATH=. .venv/bin/python benchmarks/grammar_cost.py [--batches 1,16,64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdserve.config import CacheConfig, EngineConfig, SchedulerConfig  # noqa: E402
from pdserve.engine.engine import Engine  # noqa: E402
from pdserve.requests import Constraint, ConstraintKind, SamplingParams  # noqa: E402
from pdserve.tokenizer import ChatMessage, load_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}, "words": {"type": "array", "items":
          {"type": "string"}}}, "required": ["story", "words"]}
STEPS = 40


def _engine() -> Engine:
    cache = CacheConfig(block_size=16, num_blocks=4096)
    return Engine(EngineConfig(cache=cache, scheduler=SchedulerConfig(token_budget=8192, max_chunk_tokens=8192)))


def _decode_steps(engine: Engine, prompts, sampling: SamplingParams, tag: str) -> tuple[list[float], list[float]]:
    """Step times (s) once every request decodes, and the masks' share of each (s)."""
    requests = [engine.add_request(f"{tag}-{i}", prompt, sampling) for i, prompt in enumerate(prompts)]
    while any(not r.output_token_ids for r in requests):  # prefilled: every step after is a decode
        engine.step()
    steps, masks = [], []
    grammar = engine.runner.grammar
    apply = grammar.apply
    spent = [0.0]

    def timed_apply(*args):
        start = time.perf_counter()
        try:
            return apply(*args)
        finally:
            spent[0] += time.perf_counter() - start

    grammar.apply = timed_apply
    for _ in range(STEPS):
        spent[0] = 0.0
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
        masks.append(spent[0])
    grammar.apply = apply
    for i in range(len(prompts)):
        engine.abort(f"{tag}-{i}")
    while engine.has_unfinished():
        engine.step()
    return steps, masks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(None)
    engine = _engine()
    free = SamplingParams(max_tokens=STEPS + 8, temperature=0.8, seed=1)
    constrained = SamplingParams(max_tokens=STEPS + 8, temperature=0.8, seed=1,
                                 constraint=Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)))
    print(f"embedded model, {args.threads} thread(s), {STEPS} decode steps per run; times are means per step")
    print(f"{'batch':>6} {'free ms':>9} {'schema ms':>10} {'masks ms':>9} {'masks/step':>11} {'ratio':>6}")
    for batch in (int(b) for b in args.batches.split(",")):
        prompts = [tokenizer.apply_chat_template([ChatMessage("user", f"Tell story number {i} as JSON.")])
                   for i in range(batch)]
        _decode_steps(engine, prompts, constrained, f"warm{batch}")  # the backend and the buffers, once
        base, _ = _decode_steps(engine, prompts, free, f"free{batch}")
        steps, masks = _decode_steps(engine, prompts, constrained, f"json{batch}")
        b, s, m = statistics.mean(base), statistics.mean(steps), statistics.mean(masks)
        print(f"{batch:>6} {b * 1e3:>9.2f} {s * 1e3:>10.2f} {m * 1e3:>9.2f} {m / s:>10.1%} {s / b:>6.2f}")


if __name__ == "__main__":
    main()
