"""The Llama decoder (also Mistral, Qwen2, Qwen3 and Gemma 3, which differ only in config: q/k/v
bias, per-head q/k norms; Gemma 3's scaled embeddings, four norms a layer, GeGLU, per-layer
windows and rotary bases, its softcapped logits).

    tokens -> embed -> N x [ x + attn(norm(x)); x + mlp(norm(x)) ] -> norm -> lm_head -> logits

Each layer's window and score scale (LayerAttention) go to the attention backend in `begin`; a
windowed layer of a model with a local rotary base rotates with that base.

One forward pass computes a mixed batch (prefill chunks and decode tokens, flattened to T rows,
see ForwardBatch); logits are computed only for the rows in `batch.logits_indices`. With
`fused_decode` set (pdserve/cpu/fused_decode.py), a decode step (of up to PANEL_MAX_ROWS
sequences) goes through every layer in one C call instead of layer by layer.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from pdserve.attention.base import AttentionBackend, LayerAttention
from pdserve.attention.batch import ForwardBatch
from pdserve.kv.kv_cache import KVCache
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.checkpoint.rope_scaling import NoRopeScaling
from pdserve.model.layers import Linear, decoder_layer, make_norm
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
        self.layers = nn.ModuleList(decoder_layer(config, i) for i in range(config.num_layers))
        self.norm = make_norm(config, config.hidden_size)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)  # weight [hidden, vocab]
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        local = config.local_rope_theta
        self.local_rotary = None if local is None else RotaryEmbedding(config.head_dim, local, NoRopeScaling())
        layers = range(config.num_layers)
        self.attention = tuple(LayerAttention(config.window(i), config.attention_scale) for i in layers)
        self.local_layers = tuple(config.local_rope(i) for i in layers)  # rotate with local_rotary
        self.fused_decode: FusedLayers | None = None  # set by fuse_decode where the layers qualify

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache, attn: AttentionBackend,
                logits: torch.Tensor | None = None) -> torch.Tensor:
        """Returns logits [S, vocab] for `batch.logits_indices` (S rows, in that order), written
        into `logits` where given: an [S, vocab] tensor of the model's dtype and device that the
        caller reuses step after step (pdserve/engine/host_logits.py says why).

        Calls `attn.begin(batch, kv)` once, then each layer writes its K/V at `batch.slot_mapping`.
        """
        attn.begin(batch, kv, self.attention)
        x = self.embed(batch.input_ids)  # [T, hidden]
        cos, sin = self.rotary(batch.positions, x.dtype)  # [T, 1, D/2] each
        fused = self.fused_decode.forward(x, cos, sin, batch, kv, attn) if self.fused_decode else None
        if fused is None:
            local = self.local_rotary(batch.positions, x.dtype) if self.local_rotary is not None else None
            for layer, is_local in zip(self.layers, self.local_layers):
                x = layer(x, *(local if is_local else (cos, sin)), kv, attn)
        x = self.norm(x[batch.logits_indices])  # [S, hidden]
        return self._softcapped(self.lm_head(x, out=logits))  # [S, vocab]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden]. Tied models keep one matrix, the lm_head's [hidden, vocab]: a
        token's embedding is its column. Times the config's embedding scale where it has one (in
        the model's dtype, as transformers rounds it)."""
        if self.embed_tokens is not None:
            x = self.embed_tokens(input_ids)
        else:
            x = self.lm_head.weight.index_select(1, input_ids).t().contiguous()
        scale = self.config.embedding_scale
        return x if scale is None else x * torch.tensor(scale, dtype=torch.float32).to(x.dtype)

    def _softcapped(self, logits: torch.Tensor) -> torch.Tensor:
        """cap * tanh(logits / cap) in place, where the config caps them."""
        cap = self.config.final_logit_softcap
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device
