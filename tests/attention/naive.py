"""Dense attention in float64, one sequence and one query at a time: the oracle for backends."""

from __future__ import annotations

import math

import torch


def naive_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first_position: int) -> torch.Tensor:
    """q: [Q, H, D] at positions first_position.. ; keys/values: [C, Hkv, D] for positions 0..C-1.
    Returns [Q, H, D]: query i sees keys 0..first_position + i."""
    num_heads, kv_heads, head_dim = q.shape[1], keys.shape[1], q.shape[2]
    group = num_heads // kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        visible = first_position + i + 1
        for h in range(num_heads):
            k = keys[:visible, h // group].double()  # [visible, D]
            scores = (k @ q[i, h].double()) / math.sqrt(head_dim)  # [visible]
            out[i, h] = torch.softmax(scores, dim=0) @ values[:visible, h // group].double()
    return out
