"""What rank 0 sends the other ranks of its worker, step by step: each plan is everything a
follower's model runner needs to do what rank 0's does, on its own heads.

    SwapPlan     blocks to copy device -> host and host -> device (the step's preemptions, resumes)
    ForwardPlan  the step's ForwardBatch (ids, positions, KV slots, block tables, logits rows)

Only rank 0 samples; a follower's logits are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pdserve.attention.batch import ForwardBatch, SeqSpan

if TYPE_CHECKING:
    from pdserve.parallel.follower import FollowerState


@dataclass(frozen=True)
class SwapPlan:
    swap_out: tuple[tuple[int, int], ...]  # (device block, host block)
    swap_in: tuple[tuple[int, int], ...]  # (host block, device block)

    def run(self, state: "FollowerState") -> None:
        """swap_out before swap_in, as rank 0 copies them."""
        state.kv.copy_blocks_to(state.host_kv, list(self.swap_out))
        state.host_kv.copy_blocks_to(state.kv, list(self.swap_in))


@dataclass(frozen=True)
class ForwardPlan:
    """A ForwardBatch as numpy arrays (they pickle in tens of microseconds; tensors take ms)."""

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    logits_indices: np.ndarray  # [S] int64
    seqs: tuple[SeqSpan, ...]
    group_slots: tuple[np.ndarray, ...] = ()  # per layer group of a hybrid model's pool

    @classmethod
    def of(cls, batch: ForwardBatch) -> "ForwardPlan":
        arrays = (batch.input_ids, batch.positions, batch.slot_mapping, batch.logits_indices)
        return cls(*(t.cpu().numpy() for t in arrays), batch.seqs, tuple(t.cpu().numpy() for t in batch.group_slots))

    def batch(self, device: torch.device) -> ForwardBatch:
        ids, positions, slots, rows = (torch.from_numpy(a).to(device)
                                       for a in (self.input_ids, self.positions, self.slot_mapping,
                                                 self.logits_indices))
        groups = tuple(torch.from_numpy(a).to(device) for a in self.group_slots)
        return ForwardBatch(ids, positions, slots, self.seqs, rows, groups)

    def run(self, state: "FollowerState") -> None:
        state.model.forward(self.batch(state.device), state.kv, state.attn)


Plan = SwapPlan | ForwardPlan
