"""What rank 0 sends the other ranks of its worker, step by step: each plan is everything a
follower's model runner needs to do what rank 0's does, on its own heads.

    SwapPlan     blocks to copy device -> host and host -> device (the step's preemptions, resumes)
    ForwardPlan  the step's ForwardBatch (ids, positions, KV slots, block tables, logits rows)

Only rank 0 samples; a follower's logits are dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pdserve.attention.batch import ForwardBatch

if TYPE_CHECKING:
    from pdserve.parallel.follower import FollowerState


def batch_on(batch: ForwardBatch, device: torch.device | str) -> ForwardBatch:
    """The same batch with its tensors on `device`."""
    return dataclasses.replace(batch, input_ids=batch.input_ids.to(device), positions=batch.positions.to(device),
                               slot_mapping=batch.slot_mapping.to(device),
                               logits_indices=batch.logits_indices.to(device))


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
    batch: ForwardBatch  # tensors on the CPU

    def run(self, state: "FollowerState") -> None:
        state.model.forward(batch_on(self.batch, state.device), state.kv, state.attn)


Plan = SwapPlan | ForwardPlan
