"""Whole-engine checks on the embedded model: bfloat16 against float32, the swap path under a
tight KV pool, and tensor parallelism at 2 ranks against 1."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.gpu.common import Row, Verdict
from benchmarks.gpu.engine_runs import BLOCK_SIZE, Ask, chat_prompts, drive, engine_for, no_block_held
from pdserve.config import EngineConfig, PreemptionConfig

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about memory bandwidth.",
    "Explain in two sentences why a KV cache makes decoding faster.",
)
# float32 top-2 logit gap above which bfloat16 must choose the same token: bfloat16 logits of this
# model come in steps of 0.125 near their top, and on CPU its gaps moved by up to about 0.45
GAP_TOLERANCE = 1.0
ALWAYS_SWAP = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0)


def greedy_asks(prompts: Sequence[tuple[int, ...]], new_tokens: int) -> list[Ask]:
    return [Ask(f"p{i}", prompt, new_tokens) for i, prompt in enumerate(prompts)]


def forced_asks(prompts: Sequence[tuple[int, ...]], reference: dict[str, list[int]]) -> list[Ask]:
    """After every prefix of the reference's tokens, one more token."""
    return [Ask(f"p{i}@{j}", prompt, j + 1, tuple(reference[f"p{i}"][:j]))
            for i, prompt in enumerate(prompts) for j in range(len(reference[f"p{i}"]))]


def half_row(device: torch.device, model: str | None = None, half: str = "auto", new_tokens: int = 24,
             questions: Sequence[str] = QUESTIONS, tolerance: float = GAP_TOLERANCE) -> Row:
    """The half-precision engine a GPU user gets (`auto`) against float32 with the torch backend:
    teacher-forced at every position whose float32 gap is clear, and free-running up to the first
    position that is not."""
    prompts = chat_prompts(model, questions)
    reference = drive(engine_for(device, model, "float32", "torch"), greedy_asks(prompts, new_tokens))
    engine = engine_for(device, model, half, "auto")
    got = drive(engine, greedy_asks(prompts, new_tokens) + forced_asks(prompts, reference.tokens))
    clear = [(f"p{i}", j) for i in range(len(prompts)) for j, gap in enumerate(reference.gaps[f"p{i}"])
             if gap > tolerance]
    agree = sum(got.tokens[f"{rid}@{j}"][-1] == reference.tokens[rid][j] for rid, j in clear)
    free = sum(_equal_while_clear(got.tokens[rid], reference.tokens[rid], reference.gaps[rid], tolerance)
               for rid in reference.tokens)
    name = f"{str(engine.kv.data.dtype).removeprefix('torch.')} ({engine.runner.attn.name})"
    result = (f"{name} vs float32 (torch), {_model_name(model)}, {len(prompts)} prompts x {new_tokens} tokens: "
              f"{agree}/{len(clear)} positions with a float32 top-2 gap > {tolerance} agree; "
              f"{free}/{len(prompts)} free runs equal float32 up to their first smaller gap")
    verdict = Verdict.OK if agree == len(clear) and free == len(prompts) and clear else Verdict.FAIL
    return Row(f"model: {name} vs float32", result, verdict)


def _model_name(model: str | None) -> str:
    return "embedded SmolLM2-135M" if model is None else Path(model).name


def _equal_while_clear(got: list[int], expected: list[int], gaps: list[float], tolerance: float) -> bool:
    until = next((j for j, gap in enumerate(gaps) if gap <= tolerance), len(gaps))
    return got[:until] == expected[:until]


def swap_row(device: torch.device, model: str | None = None, new_tokens: int = 48,
             questions: Sequence[str] = QUESTIONS) -> Row:
    """A pool that holds only the longest request, every preemption swapped to pinned host memory
    and back (float32, torch backend: the batch shapes differ between the two runs, and float32
    keeps that from deciding a token); the tokens equal an unpressured run's."""
    prompts = chat_prompts(model, [q * 3 for q in questions] + list(questions))
    asks = greedy_asks(prompts, new_tokens)
    roomy = drive(engine_for(device, model, "float32", "torch"), asks)
    tight_blocks = max(-(-(len(p) + new_tokens) // BLOCK_SIZE) for p in prompts) + 1
    engine = engine_for(device, model, "float32", "torch", num_blocks=tight_blocks, num_host_blocks=4 * tight_blocks,
                        preemption=ALWAYS_SWAP)
    tight = drive(engine, asks)
    equal = sum(tight.tokens[a.request_id] == roomy.tokens[a.request_id] for a in asks)
    released = no_block_held(engine)
    result = (f"{tight_blocks}-block pool ({engine.kv.data.device}, host pinned: {engine.host_kv.data.is_pinned()}): "
              f"{tight.swaps} swaps, {tight.recomputes} recomputes; {equal}/{len(asks)} requests equal the "
              f"unpressured run; blocks all returned: {released}")
    ok = tight.swaps > 0 and tight.recomputes == 0 and equal == len(asks) and released
    return Row("engine: swap under a tight pool", result, Verdict.OK if ok else Verdict.FAIL)


def tensor_parallel_built() -> bool:
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    return "tensor_parallel_size" in fields and importlib.util.find_spec("pdserve.parallel.leader") is not None


def tensor_parallel_row(device: torch.device, model: str | None = None, new_tokens: int = 24) -> Row:
    """TP=2 against TP=1, float32 greedy on the embedded model."""
    name = "engine: tensor parallel 2 vs 1"
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        return Row(name, f"needs 2 GPUs, found {torch.cuda.device_count()}", Verdict.SKIP)
    if not tensor_parallel_built():
        return Row(name, "not built", Verdict.SKIP)
    prompts = chat_prompts(model, QUESTIONS)
    asks = greedy_asks(prompts, new_tokens)
    single = drive(engine_for(device, model, "float32", "torch"), asks)
    engine = engine_for(device, model, "float32", "torch", tensor_parallel_size=2)
    try:
        split = drive(engine, asks)
    finally:
        engine.loaded.ranks.close()
    equal = sum(split.tokens[a.request_id] == single.tokens[a.request_id] for a in asks)
    result = f"float32 greedy, {len(asks)} prompts x {new_tokens} tokens: {equal}/{len(asks)} equal TP=1"
    return Row(name, result, Verdict.OK if equal == len(asks) else Verdict.FAIL)
