"""Deterministic mode on the device (`--deterministic`): greedy requests alone against all
together, their prompts in chunks of 7 tokens, with their outputs' top-2 logprob gaps (the
logits' fingerprint) required bitwise equal. The GPU path (projections in fixed tiles of rows,
flashinfer's decode kernel a row at a time with the split of keys off) is checked only here."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from benchmarks.gpu.common import Row, Verdict
from benchmarks.gpu.engine_checks import QUESTIONS, greedy_asks
from benchmarks.gpu.engine_runs import chat_prompts, drive, engine_for

CHUNK_TOKENS = 7


def deterministic_row(device: torch.device, model: str | None = None, new_tokens: int = 24,
                      questions: Sequence[str] = QUESTIONS) -> Row:
    asks = greedy_asks(chat_prompts(model, questions), new_tokens)
    alone_engine = engine_for(device, model, "auto", "auto", deterministic=True)
    alone = {a.request_id: _fingerprint(drive(alone_engine, [a]), a.request_id) for a in asks}
    engine = engine_for(device, model, "auto", "auto", max_chunk_tokens=CHUNK_TOKENS, deterministic=True)
    together = drive(engine, asks)
    differ = [a.request_id for a in asks if _fingerprint(together, a.request_id) != alone[a.request_id]]
    attn = engine.runner.attn
    name = f"{str(engine.kv.data.dtype).removeprefix('torch.')} ({attn.name}/{attn.kernel.name})"
    result = (f"{name}, {len(asks)} prompts x {new_tokens} tokens, alone against together in chunks of "
              f"{CHUNK_TOKENS}: {len(asks) - len(differ)}/{len(asks)} bitwise equal (tokens and top-2 gaps)")
    return Row(f"deterministic: {name}", result, Verdict.FAIL if differ else Verdict.OK)


def _fingerprint(outcome, request_id: str) -> tuple:
    return tuple(outcome.tokens[request_id]), tuple(outcome.gaps[request_id])
