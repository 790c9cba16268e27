"""A rank's shard read straight from the checkpoint, never the whole model: the model is built on
`meta`, turned into the rank's shard by the transform (shard.py), and each of the shard's
parameters is assembled from the rank's slices of the checkpoint tensors (checkpoint_slices.py).

    shard parameter           checkpoint tensors ([out, in])   the rank reads
    qkv_proj.weight, .bias    q_proj, k_proj, v_proj           rows q, kv, kv (its heads)
    o_proj.weight             o_proj                           columns q
    gate_up_proj.weight       gate_proj, up_proj               rows mlp
    down_proj.weight          down_proj                        columns mlp
    embed_tokens, lm_head     embed_tokens (tied) or lm_head   rows of its vocabulary, zero-padded
    norms, o_proj.bias        as they are                      all of it (replicated)

So a rank reads 1/N of every split tensor plus the replicated ones; tied embeddings are read
once. The shapes are checked against the full config before anything is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.source import resolve_model_path
from pdserve.model.llama import LlamaForCausalLM
from pdserve.model.loader import LoadedModel
from pdserve.model.weights import Assembly, Part, checkpoint_layout
from pdserve.parallel.checkpoint_slices import CheckpointSlices, Cut, open_slices
from pdserve.parallel.communicator import Communicator
from pdserve.parallel.shard import RankSplit, Span, check_tensor_parallel, shard_model


class PartCuts(NamedTuple):
    """The cut of each part of one parameter's Assembly (None: all of it), and the rows the
    joined parts are zero-padded to (None: no padding)."""

    cuts: tuple[Cut | None, ...]
    pad_rows: int | None = None


def load_model_shard(path: str | None, device: str | torch.device, dtype: torch.dtype,
                     comm: Communicator) -> LoadedModel:
    """Rank `comm.rank`'s tensor-parallel shard of the model at `path` (resolved as load_model
    resolves it), read a slice at a time: the device holds the shard only."""
    source = resolve_model_path(path)
    model = load_shard(source, device, dtype, comm)
    return LoadedModel(model.config, model, source)


def load_shard(source: Path, device: str | torch.device, dtype: torch.dtype, comm: Communicator) -> LlamaForCausalLM:
    """Rank `comm.rank`'s shard of the checkpoint at `source` (resolved), its parameters on
    `device`. Raises TensorParallelError, ModelLoadError."""
    slices = open_slices(source)
    try:
        return build_shard(slices, str(source), device, dtype, comm)
    finally:
        slices.close()


def build_shard(slices: CheckpointSlices, origin: str, device: str | torch.device, dtype: torch.dtype,
                comm: Communicator) -> LlamaForCausalLM:
    full = slices.config
    check_tensor_parallel(full, comm.world_size)
    split = RankSplit(full, comm.rank, comm.world_size)
    with torch.device("meta"):
        model = LlamaForCausalLM(full)
    shard = shard_model(model, comm)
    state = {name: _assemble(slices, assembly, part_cuts(name, split, len(assembly.parts)), origin)
             .to(device=device, dtype=dtype) for name, assembly in checkpoint_layout(full).items()}
    _assign(shard, state, f"{origin}: weights do not fit rank {comm.rank}'s shard")
    return shard.to(device).eval()


def _assign(shard: LlamaForCausalLM, state: dict[str, torch.Tensor], error: str) -> None:
    """Every parameter assigned (a tied embedding's shared LM head under its second name too)."""
    try:
        result = shard.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{error}: {exc}") from exc
    unset = [name for name, p in shard.named_parameters(remove_duplicate=False) if p.is_meta]
    if result.unexpected_keys or unset:
        raise ModelLoadError(f"{error}: unexpected {result.unexpected_keys}, not loaded {unset}")


def part_cuts(name: str, split: RankSplit, parts: int) -> PartCuts:
    """What rank `split.rank` reads of each checkpoint tensor behind model parameter `name`."""
    suffix = name.split(".", 2)[2] if name.startswith("layers.") else name
    rows, columns = (lambda s: Cut(0, *s)), (lambda s: Cut(1, *s))
    if suffix in ("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias"):
        return PartCuts((rows(split.q), rows(split.kv), rows(split.kv)))
    if suffix == "self_attn.o_proj.weight":
        return PartCuts((columns(split.q),))
    if suffix == "mlp.gate_up_proj.weight":
        return PartCuts((rows(split.mlp), rows(split.mlp)))
    if suffix == "mlp.down_proj.weight":
        return PartCuts((columns(split.mlp),))
    if suffix in ("embed_tokens.weight", "lm_head.weight"):
        vocab = split.vocab
        return PartCuts((rows(Span(vocab.start, vocab.end - vocab.start)),), pad_rows=vocab.size)
    return PartCuts((None,) * parts)


def _assemble(slices: CheckpointSlices, assembly: Assembly, plan: PartCuts, origin: str) -> torch.Tensor:
    tensors = [_read_checked(slices, part, cut, origin) for part, cut in zip(assembly.parts, plan.cuts, strict=True)]
    joined = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    if plan.pad_rows is not None and plan.pad_rows > joined.shape[0]:
        joined = F.pad(joined, [0, 0, 0, plan.pad_rows - joined.shape[0]])
    return joined.t().contiguous() if assembly.transpose else joined.contiguous()


def _read_checked(slices: CheckpointSlices, part: Part, cut: Cut | None, origin: str) -> torch.Tensor:
    try:
        shape = slices.shape(part.source)
    except KeyError:
        raise ModelLoadError(f"{origin}: missing tensor {part.source!r}") from None
    if shape != part.shape:
        raise ModelLoadError(f"{origin}: tensor {part.source!r} has shape {shape}, the config implies {part.shape}")
    return slices.read(part.source, cut)
