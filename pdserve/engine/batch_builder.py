"""Turns the scheduler's chunks into one flat ForwardBatch (see pdserve/attention/batch.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.scheduler.output import ScheduledChunk


def slots_for(block_table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Flat KV slots of positions [start, end): block_table[p // bs] * bs + p % bs."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def prompt_positions(chunk: ScheduledChunk) -> range:
    """The chunk's positions whose logits give a prompt token's log-probability its request asked
    for and has not got yet (position j: prompt token j + 1's)."""
    request = chunk.request
    if not request.prompt_logprobs_missing:
        return range(0)
    start = max(chunk.start, len(request.prompt_logprobs))
    return range(start, max(start, min(chunk.end, request.num_prompt_tokens - 1)))


def build_forward_batch(chunks: Sequence[ScheduledChunk], block_size: int, device: torch.device,
                        groups: int = 1) -> ForwardBatch:
    """Logits rows: one per chunk that samples, in order, then the rows of `prompt_positions` of
    each chunk, in order. `groups`: the pool's layer groups (tables interleave their pages)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[list[int]] = [[] for _ in range(groups)]  # per layer group
    seqs: list[SeqSpan] = []
    logits_rows: list[int] = []
    prompt_rows: list[int] = []
    for chunk in chunks:
        query_start = len(ids)
        ids.extend(chunk.request.all_token_ids[chunk.start : chunk.end])
        positions.extend(range(chunk.start, chunk.end))
        if groups == 1:
            slots[0].extend(slots_for(chunk.block_table, chunk.start, chunk.end, block_size))
        else:
            for g in range(groups):
                slots[g].extend(slots_for(chunk.block_table[g::groups], chunk.start, chunk.end, block_size))
        seqs.append(SeqSpan(query_start, chunk.num_tokens, chunk.end, tuple(chunk.block_table)))
        if chunk.samples:
            logits_rows.append(len(ids) - 1)
        prompt_rows.extend(query_start + p - chunk.start for p in prompt_positions(chunk))
    group_slots = tuple(_long(group, device) for group in slots)
    return ForwardBatch(
        input_ids=_long(ids, device),
        positions=_long(positions, device),
        slot_mapping=group_slots[0],
        seqs=tuple(seqs),
        logits_indices=_long(logits_rows + prompt_rows, device),
        group_slots=group_slots if groups > 1 else (),
    )


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
