"""Checkpoint tensors (transformers names) -> a ready LlamaForCausalLM.

Both loaders present their tensors under the transformers names; this module checks every shape,
fuses q/k/v and gate/up into one matrix each, transposes projection matrices to the model's
[in, out] layout, and assigns them to a model built on `meta` (no memory is allocated or
initialised for weights that are about to be replaced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pdserve.checkpoint.model_config import ModelConfig
from pdserve.checkpoint.errors import ModelLoadError
from pdserve.model.llama import LlamaForCausalLM

TensorFetch = Callable[[str], torch.Tensor]  # transformers name -> tensor; KeyError when absent


@dataclass(frozen=True)
class Part:
    source: str  # transformers tensor name
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Assembly:
    """The checkpoint tensors concatenated along dim 0 into one parameter, then transposed
    ([out, in] -> [in, out]) when the parameter is a projection matrix."""

    parts: tuple[Part, ...]
    transpose: bool = False


def checkpoint_layout(config: ModelConfig) -> dict[str, Assembly]:
    """Model parameter name -> how to build it from checkpoint tensors."""
    c = config
    embedding = Part("model.embed_tokens.weight", (c.vocab_size, c.hidden_size))
    layout = {} if c.tie_word_embeddings else {"embed_tokens.weight": Assembly((embedding,))}
    for i in range(c.num_layers):
        layout.update(_layer_layout(c, i))
    layout["norm.weight"] = Assembly((Part("model.norm.weight", (c.hidden_size,)),))
    output = embedding if c.tie_word_embeddings else Part("lm_head.weight", (c.vocab_size, c.hidden_size))
    layout["lm_head.weight"] = Assembly((output,), transpose=True)
    return layout


def _layer_layout(c: ModelConfig, i: int) -> dict[str, Assembly]:
    src, dst = f"model.layers.{i}.", f"layers.{i}."
    qkv_rows = {"q": c.q_size, "k": c.kv_size, "v": c.kv_size}

    def one(name: str, shape: tuple[int, ...], transpose: bool = False) -> Assembly:
        return Assembly((Part(src + name, shape),), transpose)

    layout = {
        dst + "input_layernorm.weight": one("input_layernorm.weight", (c.hidden_size,)),
        dst + "self_attn.qkv_proj.weight": Assembly(
            tuple(Part(f"{src}self_attn.{n}_proj.weight", (rows, c.hidden_size)) for n, rows in qkv_rows.items()),
            transpose=True,
        ),
        dst + "self_attn.o_proj.weight": one("self_attn.o_proj.weight", (c.hidden_size, c.q_size), True),
        dst + "post_attention_layernorm.weight": one("post_attention_layernorm.weight", (c.hidden_size,)),
        dst + "mlp.gate_up_proj.weight": Assembly(
            tuple(Part(f"{src}mlp.{n}_proj.weight", (c.intermediate_size, c.hidden_size)) for n in ("gate", "up")),
            transpose=True,
        ),
        dst + "mlp.down_proj.weight": one("mlp.down_proj.weight", (c.hidden_size, c.intermediate_size), True),
    }
    if c.attention_bias:
        layout[dst + "self_attn.qkv_proj.bias"] = Assembly(
            tuple(Part(f"{src}self_attn.{n}_proj.bias", (rows,)) for n, rows in qkv_rows.items())
        )
    if c.o_proj_bias:
        layout[dst + "self_attn.o_proj.bias"] = one("self_attn.o_proj.bias", (c.hidden_size,))
    if c.qk_norm:
        for n in ("q_norm", "k_norm"):
            layout[f"{dst}self_attn.{n}.weight"] = one(f"self_attn.{n}.weight", (c.head_dim,))
    if c.sandwich_norms:
        for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            layout[f"{dst}{n}.weight"] = one(f"{n}.weight", (c.hidden_size,))
    return layout


def build_model(
    config: ModelConfig, fetch: TensorFetch, origin: str, device: str | torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    """Raises ModelLoadError naming the first missing or misshapen tensor (and `origin`)."""
    return model_from_state(config, assemble_state(config, fetch, origin, device, dtype), origin, device)


def assemble_state(
    config: ModelConfig, fetch: TensorFetch, origin: str, device: str | torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The model's state dict from the checkpoint's tensors; raises ModelLoadError naming the
    first missing or misshapen tensor (and `origin`)."""
    return {
        name: _assemble(assembly, fetch, origin, device, dtype) for name, assembly in checkpoint_layout(config).items()
    }


def model_from_state(config: ModelConfig, state: dict[str, torch.Tensor], origin: str,
                     device: str | torch.device) -> LlamaForCausalLM:
    """The model holding `state`'s tensors themselves (assigned, not copied)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{origin}: weights do not fit the model: {exc}") from exc
    return model.to(device).eval()


def _assemble(
    assembly: Assembly, fetch: TensorFetch, origin: str, device: str | torch.device, dtype: torch.dtype
) -> torch.Tensor:
    tensors = [_fetch_checked(part, fetch, origin).to(device=device, dtype=dtype) for part in assembly.parts]
    joined = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    return joined.t().contiguous() if assembly.transpose else joined.contiguous()


def _fetch_checked(part: Part, fetch: TensorFetch, origin: str) -> torch.Tensor:
    try:
        tensor = fetch(part.source)
    except KeyError:
        raise ModelLoadError(f"{origin}: missing tensor {part.source!r}") from None
    if tuple(tensor.shape) != part.shape:
        raise ModelLoadError(
            f"{origin}: tensor {part.source!r} has shape {tuple(tensor.shape)}, the config implies {part.shape}"
        )
    return tensor
