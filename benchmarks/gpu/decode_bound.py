"""Decode step time of a model at Llama-3-8B's real sizes (random weights) against its memory
bound: the bytes one step must read (every weight but the embedding table, and the KV of every
context) over the GPU's copy bandwidth measured in the same run.

    copy bandwidth = (bytes read + bytes written) / time of one device-to-device copy
    bound (s/step) = (weight bytes + batch x context x KV bytes per token) / copy bandwidth
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.gpu.common import Row, Verdict, median_seconds, release_memory
from pdserve.attention import make_attention_backend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.kv.kv_cache import KVCache
from pdserve.checkpoint.hf_config import config_from_hf
from pdserve.checkpoint.model_config import ModelConfig
from pdserve.model.llama import LlamaForCausalLM
from pdserve.model.weights import build_model, checkpoint_layout

LLAMA_3_8B: dict[str, Any] = {  # config.json of Meta-Llama-3-8B, as far as the model reads it
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "bos_token_id": 128000, "eos_token_id": 128001,
}
BLOCK_SIZE = 16
COPY_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class DecodeShape:
    batches: tuple[int, ...] = (1, 8, 32, 64)
    context: int = 1024
    steps: int = 10


def random_model(raw: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    """The model `raw` describes, weights N(0, 0.02) drawn on the device, built by the loader's own path."""
    config = config_from_hf(raw, "random weights")
    shapes = {p.source: p.shape for a in checkpoint_layout(config).values() for p in a.parts}
    generator = torch.Generator(device=device).manual_seed(seed)
    draw = lambda name: torch.empty(shapes[name], device=device, dtype=dtype).normal_(0.0, 0.02, generator=generator)  # noqa: E731
    return build_model(config, draw, "random weights", device, dtype)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes read plus written per second by one device-to-device copy of `nbytes`."""
    source = torch.ones(nbytes, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, repeats=5, warmup=2)
    return 2 * nbytes / seconds


def decode_inputs(config: ModelConfig, batch: int, context: int, dtype: torch.dtype,
                  device: torch.device) -> tuple[KVCache, ForwardBatch]:
    """`batch` sequences of `context` tokens, each decoding its last one over random KV."""
    per_seq = -(-context // BLOCK_SIZE)
    kv = KVCache(config.kv_shape(BLOCK_SIZE), batch * per_seq, dtype, device)
    kv.data.normal_()
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    last = context - 1
    slots = [t[last // BLOCK_SIZE] * BLOCK_SIZE + last % BLOCK_SIZE for t in tables]
    as_long = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
    spans = tuple(SeqSpan(i, 1, context, t) for i, t in enumerate(tables))
    ids = torch.randint(0, config.vocab_size, (batch,), device=device)
    return kv, ForwardBatch(ids, as_long([last] * batch), as_long(slots), spans, as_long(list(range(batch))))


def step_bytes(model: LlamaForCausalLM, kv: KVCache, batch: int, context: int) -> int:
    """What one decode step reads: every weight but the embedding table (a few rows of it are read),
    and each sequence's KV."""
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if name != "embed_tokens.weight")
    return weights + batch * context * kv.block_nbytes // kv.block_size


def decode_rows(device: torch.device, raw: dict[str, Any] = LLAMA_3_8B, dtype: torch.dtype = torch.bfloat16,
                shape: DecodeShape = DecodeShape(), backend: str = "auto", copy_bytes: int = COPY_BYTES) -> list[Row]:
    bandwidth = copy_bandwidth(device, copy_bytes)
    release_memory(device)
    model = random_model(raw, device, dtype)
    attn = make_attention_backend(backend, device, dtype)
    rows = [Row("memory: copy bandwidth", f"{bandwidth / 1e9:.0f} GB/s (read + write, {copy_bytes >> 20} MiB copy)")]
    for batch in shape.batches:
        rows.append(_decode_row(model, attn, batch, shape, bandwidth, device))
        release_memory(device)
    return rows


def _decode_row(model: LlamaForCausalLM, attn, batch: int, shape: DecodeShape, bandwidth: float,
                device: torch.device) -> Row:
    kv, inputs = decode_inputs(model.config, batch, shape.context, model.dtype, device)
    seconds = median_seconds(lambda: model(inputs, kv, attn), device, repeats=shape.steps, warmup=3)
    nbytes = step_bytes(model, kv, batch, shape.context)
    bound = nbytes / bandwidth
    name = f"decode {_size_name(model)} {str(model.dtype).removeprefix('torch.')}: batch {batch}, context {shape.context}"
    result = (f"{1e3 * seconds:.2f} ms/step ({batch / seconds:.0f} tokens/s, {attn.name}); bound {1e3 * bound:.2f} ms "
              f"({nbytes / 1e9:.3g} GB read): {bound / seconds:.0%} of the bound")
    return Row(name, result, Verdict.INFO)


def _size_name(model: LlamaForCausalLM) -> str:
    params = sum(p.numel() for p in model.parameters())
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def tiny_raw(vocab: int = 256, layers: int = 2) -> dict[str, Any]:
    """A small model of the same family (for a CPU run of the same code)."""
    return {**LLAMA_3_8B, "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2}
