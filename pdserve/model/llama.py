"""The Llama decoder (also Mistral, Qwen2 and Qwen3, which differ only in config: window, q/k/v
bias, per-head q/k norms).

    tokens -> embed -> N x [ x + attn(norm(x)); x + mlp(norm(x)) ] -> norm -> lm_head -> logits

One forward pass computes a mixed batch (prefill chunks and decode tokens, flattened to T rows,
see ForwardBatch); logits are computed only for the rows in `batch.logits_indices`. With
`fused_decode` set (pdserve/cpu/fused_decode.py), a decode step (of up to PANEL_MAX_ROWS
sequences) goes through every layer in one C call instead of layer by layer.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch
from pdserve.kv.kv_cache import KVCache
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.model.layers import DecoderLayer, Linear, RMSNorm
from pdserve.model.rope import RotaryEmbedding


class FusedLayers(Protocol):
    """Every decoder layer of one pass in one call (pdserve/cpu/fused_decode.py attaches one)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, kv: KVCache,
                attn: AttentionBackend) -> torch.Tensor | None:
        """x [T, hidden] through every layer, updated in place and returned; None (x untouched)
        where this pass is not one it serves."""


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        tied = config.tie_word_embeddings
        self.embed_tokens = None if tied else nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)  # weight [hidden, vocab]
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.fused_decode: FusedLayers | None = None  # set by fuse_decode where the layers qualify

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache, attn: AttentionBackend,
                logits: torch.Tensor | None = None) -> torch.Tensor:
        """Returns logits [S, vocab] for `batch.logits_indices` (S rows, in that order), written
        into `logits` where given: an [S, vocab] tensor of the model's dtype and device that the
        caller reuses step after step (pdserve/engine/host_logits.py says why).

        Calls `attn.begin(batch, kv)` once, then each layer writes its K/V at `batch.slot_mapping`.
        """
        attn.begin(batch, kv)
        x = self.embed(batch.input_ids)  # [T, hidden]
        cos, sin = self.rotary(batch.positions, x.dtype)  # [T, 1, D/2] each
        fused = self.fused_decode.forward(x, cos, sin, batch, kv, attn) if self.fused_decode else None
        if fused is None:
            for layer in self.layers:
                x = layer(x, cos, sin, kv, attn)
        x = self.norm(x[batch.logits_indices])  # [S, hidden]
        return self.lm_head(x, out=logits)  # [S, vocab]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden]. Tied models keep one matrix, the lm_head's [hidden, vocab]: a
        token's embedding is its column."""
        if self.embed_tokens is not None:
            return self.embed_tokens(input_ids)
        return self.lm_head.weight.index_select(1, input_ids).t().contiguous()

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device
