"""What one forward pass computes: a mixed batch of prefill chunks and decode tokens.

The engine's model runner builds it from the scheduler's output; the model and the attention
backends read it. Tokens of all sequences are flattened into one dimension T:

    input_ids:  [ r0 chunk (q0 tokens) | r1 decode (1) | r2 chunk (q2 tokens) | ... ]   T tokens
    seq i attends to KV positions [0, context_lens[i]); its queries sit at positions
    [context_lens[i] - query_lens[i], context_lens[i]) (causal within the chunk).

KV slots are flat indices into the paged pool: slot = block_id * block_size + offset.

A hybrid model's pool has layer groups (pdserve/kv/page_groups.py): each sequence's block_table
then interleaves its groups' pages (entry i * G + g: block i of group g, NULL_PAGE where given
back), and `group(g)` is the batch as group g's layers read and write it: its pages, its slots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from pdserve.kv.page_groups import NULL_PAGE


@dataclass(frozen=True)
class SeqSpan:
    """One sequence of the batch (a prefill chunk, or one decode token)."""

    query_start: int  # index of its first token in the flat batch
    query_len: int  # tokens computed this pass
    context_len: int  # KV length after this pass (cached prefix + this chunk)
    block_table: tuple[int, ...]  # device blocks holding positions [0, context_len)


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64: where each token's K/V is written
    seqs: tuple[SeqSpan, ...]
    logits_indices: torch.Tensor  # [S] int64: rows of the flat batch whose logits are wanted
    group_slots: tuple[torch.Tensor, ...] = ()  # per layer group, its slot_mapping (empty: one group)

    def group(self, g: int) -> ForwardBatch:
        """The batch as layer group g sees it: its own pages and slots (itself with one group).
        A page given back (NULL_PAGE) reads as page 0: only positions a window hides are there."""
        if not self.group_slots:
            return self
        count = len(self.group_slots)
        seqs = tuple(replace(s, block_table=tuple(0 if p == NULL_PAGE else p for p in s.block_table[g::count]))
                     for s in self.seqs)
        return replace(self, slot_mapping=self.group_slots[g], seqs=seqs, group_slots=())

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
