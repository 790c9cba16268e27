"""The multi-turn workload: N concurrent conversations of K turns. Each turn sends the whole
conversation so far (the previous answers included) plus new user text, as a chat does; each
conversation's opening is its own, so only its own earlier turns can be reused.

Per turn it records TTFT, the KV bytes moved to the decode worker, the prompt tokens the decode
worker already held, and whether the decode worker prefilled the turn itself. Beside the
conversations, single-turn "suffix" requests as long as a late turn's new part (previous answer
plus new user text) run in the same load: a late turn should cost about what its new part
costs, not what the whole conversation does.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import dataclass

from pdserve.client import AsyncClient, Completion, Message
from pdserve.stats import median

WORDS = ("river stone lantern orchard harbor meadow copper violet thunder garden pencil window "
         "canyon ember falcon glacier island jasmine kettle lemon marble nickel olive pepper quartz "
         "saddle timber umbrella velvet walnut yarrow zephyr anchor basil cedar dune").split()


@dataclass(frozen=True)
class ConversationSpec:
    conversations: int = 16
    turns: int = 6
    opening_words: int = 300
    turn_words: int = 40
    answer_tokens: int = 32
    seed: int = 0


@dataclass(frozen=True)
class TurnRecord:
    conversation: int  # -1: a single-turn suffix request
    turn: int
    prompt_tokens: int
    ttft_s: float
    kv_bytes: int
    decode_cached_tokens: int
    local_prefill: bool


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _record(conversation: int, turn: int, answer: Completion) -> TurnRecord:
    u = answer.usage
    return TurnRecord(conversation, turn, u.prompt_tokens, answer.timings.ttft_s or 0.0, u.kv_transfer_bytes,
                      u.decode_cached_tokens, u.local_prefill)


async def _conversation(client: AsyncClient, spec: ConversationSpec, index: int) -> list[TurnRecord]:
    rng = random.Random(spec.seed * 1000 + index)
    history = [Message("user", f"Conversation {index}. " + _text(rng, spec.opening_words))]
    records = []
    for turn in range(spec.turns):
        answer = await client.generate(messages=history, max_tokens=spec.answer_tokens, temperature=0,
                                       ignore_eos=True)
        records.append(_record(index, turn, answer))
        history += [Message("assistant", answer.text), Message("user", _text(rng, spec.turn_words))]
    return records


async def _suffixes(client: AsyncClient, spec: ConversationSpec) -> list[TurnRecord]:
    """Fresh single turns as long as a late turn's new part, spread over the run."""
    rng = random.Random(spec.seed + 7)
    records = []
    for i in range(spec.conversations):
        answer = await client.generate(messages=[Message("user", f"Suffix {i}. " + _text(rng, spec.turn_words)),
                                                 Message("assistant", _text(rng, spec.answer_tokens * 3 // 4)),
                                                 Message("user", _text(rng, spec.turn_words))],
                                       max_tokens=spec.answer_tokens, temperature=0, ignore_eos=True)
        records.append(_record(-1, 0, answer))
    return records


async def run_conversations(target: str, spec: ConversationSpec) -> list[TurnRecord]:
    async with AsyncClient(target) as client:
        runs = await asyncio.gather(*(_conversation(client, spec, i) for i in range(spec.conversations)),
                                    _suffixes(client, spec))
    return [record for run in runs for record in run]


def turn_table(records: list[TurnRecord]) -> str:
    """One row per turn index (medians and means over conversations), then the suffix baseline."""
    lines = ["| turn | prompt tokens | TTFT p50 | KV bytes (mean) | decode-cached tokens (mean) | local |",
             "|---|---|---|---|---|---|"]
    turns = sorted({r.turn for r in records if r.conversation >= 0})
    for turn in turns:
        rows = [r for r in records if r.conversation >= 0 and r.turn == turn]
        lines.append(_row(str(turn + 1), rows))
    suffix = [r for r in records if r.conversation < 0]
    if suffix:
        lines.append(_row("suffix", suffix))
        late = [r.ttft_s for r in records if r.conversation >= 0 and r.turn >= 2]
        if late:
            ratio = median(late) / median(r.ttft_s for r in suffix)
            lines.append(f"\nTTFT of turns 3+ over a same-length first turn (suffix), medians: {ratio:.2f}")
    return "\n".join(lines)


def _row(name: str, rows: list[TurnRecord]) -> str:
    return (f"| {name} | {statistics.mean(r.prompt_tokens for r in rows):.0f} | "
            f"{median(r.ttft_s for r in rows) * 1e3:.0f} ms | {statistics.mean(r.kv_bytes for r in rows):,.0f} | "
            f"{statistics.mean(r.decode_cached_tokens for r in rows):.0f} | "
            f"{sum(r.local_prefill for r in rows)}/{len(rows)} |")
