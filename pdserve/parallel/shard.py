"""The tensor-parallel transform: a loaded Llama-family model -> the shard one rank runs.

    attention  q/k/v: column-parallel over heads (rank r: query heads [r*H/n, (r+1)*H/n) and KV
               heads [r*Hkv/n, (r+1)*Hkv/n), still one fused matmul), o: row-parallel + all-reduce
    MLP        gate/up: column-parallel (still fused), down: row-parallel + all-reduce
    embedding  vocabulary-parallel, masked lookup + all-reduce; LM head: vocabulary-parallel +
               all-gather of the logits
    norms, rotary: replicated

Query head h of a rank still reads its KV head h // (H / Hkv): the split keeps whole groups
together. The model's own code is unchanged; its modules are swapped and their head counts set.
"""

from __future__ import annotations

import dataclasses

import torch

from pdserve.model.config import ModelConfig
from pdserve.model.layers import Attention, MLP
from pdserve.model.llama import LlamaForCausalLM
from pdserve.parallel.communicator import Communicator
from pdserve.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    VocabSlice,
)


class TensorParallelError(ValueError):
    """This model cannot be split across that many ranks."""


def check_tensor_parallel(config: ModelConfig, world_size: int) -> None:
    """The simulator's sizing rule (pdserve/sim/deployment.py): the size must divide the KV heads
    (and so the attention heads); the MLP width must divide too."""
    if world_size < 1:
        raise TensorParallelError(f"tensor parallel size must be at least 1, got {world_size}")
    if config.num_kv_heads % world_size:
        raise TensorParallelError(
            f"tensor parallel size {world_size} must divide {config.name}'s {config.num_kv_heads} KV heads "
            f"(and its {config.num_heads} attention heads); sizes that do: {_divisors(config.num_kv_heads)}")
    if config.intermediate_size % world_size:
        raise TensorParallelError(
            f"tensor parallel size {world_size} must divide {config.name}'s MLP width {config.intermediate_size}")


def rank_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """What one rank computes: its share of the heads (its KV pool holds only those); the
    vocabulary, the MLP width and everything else as the full model says."""
    check_tensor_parallel(config, world_size)
    return dataclasses.replace(config, num_heads=config.num_heads // world_size,
                               num_kv_heads=config.num_kv_heads // world_size)


def shard_model(model: LlamaForCausalLM, comm: Communicator) -> LlamaForCausalLM:
    """Turn `model` (consumed: its modules are replaced) into rank `comm.rank`'s shard of
    `comm.world_size`. Raises TensorParallelError when the model does not divide."""
    full, n, rank = model.config, comm.world_size, comm.rank
    local = rank_config(full, n)
    for layer in model.layers:
        _shard_attention(layer.self_attn, full, local, rank, comm)
        _shard_mlp(layer.mlp, n, rank, comm)
    vocab = VocabSlice(full.vocab_size, rank, n)
    head = VocabParallelLMHead(model.lm_head, vocab, comm)
    table = model.embed_tokens
    model.lm_head = head
    model.embed_tokens = VocabParallelEmbedding(vocab, comm, table=table, tied=None if table is not None else head)
    model.config = local
    return model


def _shard_attention(attn: Attention, full: ModelConfig, local: ModelConfig, rank: int, comm: Communicator) -> None:
    d = full.head_dim
    q = _span(rank * local.q_size, local.q_size)
    k = _span(full.q_size + rank * local.kv_size, local.kv_size)
    v = _span(full.q_size + full.kv_size + rank * local.kv_size, local.kv_size)
    attn.qkv_proj = ColumnParallelLinear(attn.qkv_proj, torch.cat([q, k, v]))
    attn.o_proj = RowParallelLinear(attn.o_proj, _span(rank * local.num_heads * d, local.num_heads * d), comm)
    attn.num_heads, attn.num_kv_heads = local.num_heads, local.num_kv_heads


def _shard_mlp(mlp: MLP, n: int, rank: int, comm: Communicator) -> None:
    width = mlp.intermediate_size // n
    gate, up = _span(rank * width, width), _span(mlp.intermediate_size + rank * width, width)
    mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj, torch.cat([gate, up]))
    mlp.down_proj = RowParallelLinear(mlp.down_proj, _span(rank * width, width), comm)
    mlp.intermediate_size = width


def _span(start: int, size: int) -> torch.Tensor:
    return torch.arange(start, start + size, dtype=torch.long)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
