"""The building blocks of a decoder layer, on a flat token dimension T (no batch axis): Llama's
(two norms a layer, SwiGLU) and Gemma 3's (four norms, each block's output normalised too; GeGLU;
norms scaled by 1 + w in float32)."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from pdserve.attention.base import AttentionBackend
from pdserve.kv.kv_cache import KVCache
from pdserve.checkpoint.model_config import Activation, ModelConfig, NormStyle
from pdserve.model.layer_kernels import LayerKernels, TorchKernels
from pdserve.model.row_route import DEFAULT_ROUTE, DENSE, MIN_PACKED_ROWS, PANELS


class WeightCopy(Protocol):
    """A projection's weight in another layout, beside the dense one (pdserve/cpu/ packs them);
    `weight` is the dense [in, out] parameter it was packed from."""

    weight: torch.Tensor

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias)."""

    @property
    def nbytes(self) -> int:
        """The dense weight's bytes (the copy takes about as much again)."""


class Linear(nn.Module):
    """y = x @ weight + bias, with `weight` stored [in_features, out_features]: the transpose of
    the checkpoint's [out, in]. NOTE: on CPU the skinny matmuls of decode steps (a few rows)
    run about twice as fast against this layout; prefill-sized matmuls are unaffected.
    With `packed` set (pdserve/cpu/weight_layout.py) the product reads a GEMM library's own
    layout of the weight (oneDNN's or MKL's); with `streamed` set, from the weight in panels
    (pdserve/cpu/panel_weights.py); `route` says which a product of so many rows reads."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: WeightCopy | None = None
        self.streamed: WeightCopy | None = None
        self.route = DEFAULT_ROUTE  # which of the weights a product of so many rows reads (auto: as measured)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, in] -> [T, out_features], written into `out` where given (a buffer of that shape
        and the weight's dtype, which the caller reuses: the panels and the dense product write
        into it, a packed weight's product is copied there)."""
        rows = x.shape[0]
        kind = self.route.kind(rows)
        if kind == PANELS and self.streamed is not None and rows > 0:
            return self.streamed(x, self.bias, out)
        if kind != DENSE and self.packed is not None and rows >= MIN_PACKED_ROWS:
            y = self.packed(x, self.bias)
            return y if out is None else out.copy_(y)
        if self.bias is None:
            return torch.matmul(x, self.weight, out=out)
        return torch.addmm(self.bias, x, self.weight, out=out)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps
        self.kernels: LayerKernels = TorchKernels()  # pdserve/cpu/layer_kernels.py sets the model's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, dim] -> [T, dim]; normalised in float32, then scaled by the learned weight."""
        return self.kernels.rms_norm(x, self.weight, self.eps)


class OffsetRMSNorm(RMSNorm):
    """Gemma's: the weight is an offset from 1 (trained around 0), applied in float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, dim] -> [T, dim]; x / rms(x) * (1 + weight), in float32, then x's dtype."""
        return self.kernels.rms_norm(x.float(), 1.0 + self.weight.float(), self.eps).to(x.dtype)


def make_norm(config: ModelConfig, dim: int) -> RMSNorm:
    """The RMS norm of the config's style over `dim` features."""
    kind = OffsetRMSNorm if config.norm_style is NormStyle.GEMMA else RMSNorm
    return kind(dim, config.rms_norm_eps)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions; q, k, v come from one fused matmul.
    With `config.qk_norm` (Qwen3, Gemma 3) each head of q and of k is RMS-normalised before the
    rotation. The layer's window and score scale are the attention backend's to apply (the model
    passes them to `attn.begin`)."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=config.o_proj_bias)
        self.q_norm = make_norm(config, config.head_dim) if config.qk_norm else None
        self.k_norm = make_norm(config, config.head_dim) if config.qk_norm else None
        self.kernels: LayerKernels = TorchKernels()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVCache, attn: AttentionBackend
    ) -> torch.Tensor:
        tokens, heads, kv_heads, head_dim = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qk, v = self.qkv_proj(x).split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
        qk = qk.view(tokens, heads + kv_heads, head_dim)
        if self.q_norm is not None:
            qk = self._normed_heads(qk)
        qk = self.kernels.rope(qk, cos, sin)  # [T, H + Hkv, D]
        q, k = qk.split([heads, kv_heads], dim=1)  # [T, H, D], [T, Hkv, D]
        out = attn.forward(self.layer, q, k, v.view(tokens, kv_heads, head_dim), kv)  # [T, H, D]
        return self.o_proj(out.reshape(tokens, heads * head_dim))

    def _normed_heads(self, qk: torch.Tensor) -> torch.Tensor:
        """qk: [T, H + Hkv, D] -> a new [T, H + Hkv, D], each q head through q_norm, each k head k_norm."""
        tokens, heads, head_dim = qk.shape[0], self.num_heads, self.head_dim
        q, k = qk.split([heads, self.num_kv_heads], dim=1)
        q = self.q_norm(q.reshape(-1, head_dim)).view(tokens, heads, head_dim)
        k = self.k_norm(k.reshape(-1, head_dim)).view(tokens, -1, head_dim)
        return torch.cat((q, k), dim=1)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one fused matmul; GeGLU (gelu's tanh
    approximation in silu's place) where the config says so."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.kernels: LayerKernels = TorchKernels()
        self.activation = config.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        if self.activation is Activation.GELU_TANH:
            return self.down_proj(self.kernels.gelu_tanh_mul(gate_up))  # [T, I] -> [T, hidden]
        return self.down_proj(self.kernels.silu_mul(gate_up))


class DecoderLayer(nn.Module):
    """Llama's layer: pre-norm residual blocks, post_attention_layernorm being the MLP's input norm."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = make_norm(config, config.hidden_size)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = make_norm(config, config.hidden_size)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVCache, attn: AttentionBackend
    ) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden], pre-norm residual blocks (each sum added into the block's
        own fresh output, x + y == y + x exactly)."""
        h = self.self_attn(self.input_layernorm(x), cos, sin, kv, attn).add_(x)
        return self.mlp(self.post_attention_layernorm(h)).add_(h)


class SandwichDecoderLayer(nn.Module):
    """Gemma 3's layer: each block's input and output normalised, the residual added after both.

        h   = x + post_attention_layernorm(attn(input_layernorm(x)))
        out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
    """

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = make_norm(config, config.hidden_size)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = make_norm(config, config.hidden_size)
        self.pre_feedforward_layernorm = make_norm(config, config.hidden_size)
        self.mlp = MLP(config)
        self.post_feedforward_layernorm = make_norm(config, config.hidden_size)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVCache, attn: AttentionBackend
    ) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        h = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv, attn)).add_(x)
        return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h))).add_(h)


def decoder_layer(config: ModelConfig, layer: int) -> nn.Module:
    """Layer `layer` of the config's form (Llama's, or Gemma 3's with four norms)."""
    return SandwichDecoderLayer(config, layer) if config.sandwich_norms else DecoderLayer(config, layer)
