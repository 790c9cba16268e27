"""What structured output costs a worker's decode step: the embedded model decoding a batch of
requests, every one under a JSON schema against none, in one run. For each batch size: the mean
decode step unconstrained and constrained, the part of the constrained step the engine's thread
spends on structured output (the matchers catching up and the masks started before the forward
pass; waiting for them and masking the logits after it: the masks themselves are computed on a
thread while the model runs), and the ratio of the steps. The issue's bound: at batch 64, masks
cost at most 10% of the step. Then what rebuilding a matcher from the tokens so far costs (the
handoff's alternative to sending the grammar's state).

Both runs decode the same prompts for the same number of steps with every request in the batch:
the unconstrained one ignores EOS, the constrained one's schema cannot be complete in fewer.

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

# At least 64 numbers: no request can complete it (and end) within the steps timed, so both runs
# keep every request decoding.
SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40}, "values": {
          "type": "array", "items": {"type": "integer"}, "minItems": 64}}, "required": ["title", "values"]}
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
    spent = [0.0]

    def timed(method):
        def run(*args):
            start = time.perf_counter()
            try:
                return method(*args)
            finally:
                spent[0] += time.perf_counter() - start
        return run

    grammar.start, grammar.apply = timed(grammar.start), timed(grammar.apply)  # this instance's own
    for _ in range(STEPS):
        spent[0] = 0.0
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
        masks.append(spent[0])
    del grammar.start, grammar.apply
    for i in range(len(prompts)):
        engine.abort(f"{tag}-{i}")
    while engine.has_unfinished():
        engine.step()
    return steps, masks


def _rebuild_ms(engine: Engine, tokenizer, lengths=(100, 1000)) -> dict[int, float]:
    """A matcher built and brought up to `n` tokens of a valid output (what a decode worker, a
    resume or a move does instead of receiving the grammar's state): ms, the best of 5."""
    backend = engine.runner.grammar.backend
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA))
    numbers = ", ".join(str(i % 1000) for i in range(2000))
    tokens = tokenizer.encode('{"title": "t", "values": [' + numbers, add_special_tokens=False)
    out = {}
    for n in lengths:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            matcher = backend.matcher(constraint)
            for token in tokens[:n]:
                matcher.consume(token)
            best = min(best, time.perf_counter() - start)
            assert matcher.error is None
        out[n] = best * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(None)
    engine = _engine()
    free = SamplingParams(max_tokens=STEPS + 8, temperature=0.8, seed=1, ignore_eos=True)
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
    for n, ms in _rebuild_ms(engine, tokenizer).items():
        print(f"a matcher rebuilt from {n} tokens of output: {ms:.2f} ms")


if __name__ == "__main__":
    main()
