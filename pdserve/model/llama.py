"""The Llama decoder (also Mistral and Qwen2, which differ only in config: window, q/k/v bias).

    tokens -> embed -> N x [ x + attn(norm(x)); x + mlp(norm(x)) ] -> norm -> lm_head -> logits

One forward pass computes a mixed batch (prefill chunks and decode tokens, flattened to T rows,
see ForwardBatch); logits are computed only for the rows in `batch.logits_indices`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch
from pdserve.kv.kv_cache import KVCache
from pdserve.model.config import ModelConfig
from pdserve.model.layers import DecoderLayer, RMSNorm
from pdserve.model.rope import RotaryEmbedding


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache, attn: AttentionBackend) -> torch.Tensor:
        """Returns logits [S, vocab] for `batch.logits_indices` (S rows, in that order).

        Calls `attn.begin(batch, kv)` once, then each layer writes its K/V at `batch.slot_mapping`.
        """
        attn.begin(batch, kv)
        x = self.embed_tokens(batch.input_ids)  # [T, hidden]
        cos, sin = self.rotary(batch.positions, x.dtype)  # [T, 1, D/2] each
        for layer in self.layers:
            x = layer(x, cos, sin, kv, attn)
        x = self.norm(x[batch.logits_indices])  # [S, hidden]
        return F.linear(x, self.output_weight)  # [S, vocab]

    @property
    def output_weight(self) -> torch.Tensor:
        """[vocab, hidden]: the lm_head, or the embedding when they are tied."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
