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
from typing import NamedTuple

import torch

from pdserve.checkpoint.model_config import ModelConfig
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


class Span(NamedTuple):
    start: int
    size: int

    def indices(self, offset: int = 0) -> torch.Tensor:
        """[size] int64: offset + start, ..., offset + start + size - 1."""
        return torch.arange(offset + self.start, offset + self.start + self.size, dtype=torch.long)


@dataclasses.dataclass(frozen=True)
class RankSplit:
    """Which part of each full weight rank `rank` of `world_size` holds, in the checkpoint's
    own coordinates (q_proj rows, k_proj / v_proj rows, gate_proj / up_proj rows; o_proj and
    down_proj take the same spans as columns)."""

    full: ModelConfig
    rank: int
    world_size: int

    @property
    def local(self) -> ModelConfig:
        return rank_config(self.full, self.world_size)

    @property
    def q(self) -> Span:
        size = self.local.q_size
        return Span(self.rank * size, size)

    @property
    def kv(self) -> Span:
        size = self.local.kv_size
        return Span(self.rank * size, size)

    @property
    def mlp(self) -> Span:
        size = self.full.intermediate_size // self.world_size
        return Span(self.rank * size, size)

    @property
    def vocab(self) -> VocabSlice:
        return VocabSlice(self.full.vocab_size, self.rank, self.world_size)


def shard_model(model: LlamaForCausalLM, comm: Communicator) -> LlamaForCausalLM:
    """Turn `model` (consumed: its modules are replaced) into rank `comm.rank`'s shard of
    `comm.world_size`. Raises TensorParallelError when the model does not divide. On a model
    built on `meta` the shard's parameters are `meta` too, of the shard's shapes."""
    split = RankSplit(model.config, comm.rank, comm.world_size)
    local = split.local
    for layer in model.layers:
        _shard_attention(layer.self_attn, split, comm)
        _shard_mlp(layer.mlp, split, comm)
    vocab = split.vocab
    head = VocabParallelLMHead(model.lm_head, vocab, comm)
    table = model.embed_tokens
    model.lm_head = head
    model.embed_tokens = VocabParallelEmbedding(vocab, comm, table=table, tied=None if table is not None else head)
    model.config = local
    return model


def _shard_attention(attn: Attention, split: RankSplit, comm: Communicator) -> None:
    full, local = split.full, split.local
    columns = [split.q.indices(), split.kv.indices(full.q_size), split.kv.indices(full.q_size + full.kv_size)]
    attn.qkv_proj = ColumnParallelLinear(attn.qkv_proj, torch.cat(columns))
    attn.o_proj = RowParallelLinear(attn.o_proj, split.q.indices(), comm)
    attn.num_heads, attn.num_kv_heads = local.num_heads, local.num_kv_heads


def _shard_mlp(mlp: MLP, split: RankSplit, comm: Communicator) -> None:
    width = split.mlp.size
    columns = [split.mlp.indices(), split.mlp.indices(mlp.intermediate_size)]
    mlp.gate_up_proj = ColumnParallelLinear(mlp.gate_up_proj, torch.cat(columns))
    mlp.down_proj = RowParallelLinear(mlp.down_proj, split.mlp.indices(), comm)
    mlp.intermediate_size = width


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
