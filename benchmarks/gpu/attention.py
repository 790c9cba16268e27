"""Two attention backends on the same mixed batch (decodes over long contexts, prefill chunks over
a cached prefix), at Llama-3-8B's attention shape: outputs and pools compared, pass time of each."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.gpu.common import Row, Verdict, median_seconds
from pdserve.attention import make_attention_backend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.selection import flashinfer_problem
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape

TOLERANCE = 2e-2  # largest |difference| between the two outputs in bfloat16 (values are O(0.1))


@dataclass(frozen=True)
class AttentionCase:
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    layers: int
    decode_contexts: tuple[int, ...]  # one decode token each, after this many tokens (itself included)
    chunks: tuple[tuple[int, int], ...]  # (cached tokens, new tokens) per prefill chunk


LLAMA_8B_CASE = AttentionCase(32, 8, 128, 16, 4, tuple(range(17, 2048, 64)), ((128, 256), (0, 300), (1000, 64)))


@dataclass(frozen=True)
class Inputs:
    kv: KVCache
    batch: ForwardBatch
    q: torch.Tensor  # [L, T, H, D]
    k: torch.Tensor  # [L, T, KV, D]
    v: torch.Tensor  # [L, T, KV, D]

    def pool_copy(self) -> KVCache:
        copy = KVCache(self.kv.shape, self.kv.num_blocks, self.kv.data.dtype, self.kv.data.device)
        copy.data.copy_(self.kv.data)
        return copy


def mixed_inputs(case: AttentionCase, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Inputs:
    """Every sequence in randomly placed blocks of a pool filled with random K/V."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [(context - 1, 1) for context in case.decode_contexts] + list(case.chunks)
    needs = [-(-(cached + new) // case.block_size) for cached, new in seqs]
    free = torch.randperm(sum(needs), generator=gen).tolist()
    spans, slots, start = [], [], 0
    for (cached, new), need in zip(seqs, needs):
        table = tuple(free[:need])
        del free[:need]
        spans.append(SeqSpan(start, new, cached + new, table))
        slots += [table[p // case.block_size] * case.block_size + p % case.block_size for p in range(cached, cached + new)]
        start += new
    kv = KVCache(KVShape(case.layers, case.kv_heads, case.head_dim, case.block_size), sum(needs), dtype, device)
    values = torch.Generator(device=device).manual_seed(seed)
    kv.data.normal_(generator=values)
    as_long = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
    zeros = as_long([0] * start)
    batch = ForwardBatch(zeros, zeros, as_long(slots), tuple(spans), as_long([s.query_start for s in spans]))
    rand = lambda heads: torch.randn(case.layers, start, heads, case.head_dim, generator=values,  # noqa: E731
                                     device=device, dtype=dtype)
    return Inputs(kv, batch, rand(case.heads), rand(case.kv_heads), rand(case.kv_heads))


def one_pass(backend, inputs: Inputs, kv: KVCache) -> torch.Tensor:
    """begin, then every layer: [L, T, H, D]."""
    backend.begin(inputs.batch, kv)
    layers = range(inputs.q.shape[0])
    return torch.stack([backend.forward(i, inputs.q[i], inputs.k[i], inputs.v[i], kv) for i in layers])


def compare_backends(names: tuple[str, str], device: torch.device, dtype: torch.dtype,
                     case: AttentionCase = LLAMA_8B_CASE) -> Row:
    """names[0] against names[1] (the reference) on one batch."""
    inputs = mixed_inputs(case, device, dtype)
    backends = [make_attention_backend(name, device, dtype) for name in names]
    pools = [inputs.pool_copy(), inputs.pool_copy()]
    got, expected = (one_pass(b, inputs, kv) for b, kv in zip(backends, pools))
    diff = (got.float() - expected.float()).abs().max().item()
    pools_equal = torch.equal(pools[0].data, pools[1].data)
    ms = [1e3 * median_seconds(lambda b=b, kv=kv: one_pass(b, inputs, kv), device, repeats=5, warmup=2)
          for b, kv in zip(backends, pools)]
    verdict = Verdict.OK if diff <= TOLERANCE and pools_equal else Verdict.FAIL
    tokens = f"{inputs.batch.num_tokens} tokens: {len(case.decode_contexts)} decodes, {len(case.chunks)} chunks"
    result = (f"max |diff| {diff:.1e} (<= {TOLERANCE}), KV pools {'equal' if pools_equal else 'DIFFER'}; "
              f"{tokens}, {case.heads}/{case.kv_heads} heads x {case.head_dim}; pass of {case.layers} layers: "
              f"{names[0]} {ms[0]:.2f} ms, {names[1]} {ms[1]:.2f} ms")
    return Row(f"attention: {names[0]} vs {names[1]}", result, verdict)


def attention_rows(device: torch.device) -> list[Row]:
    problem = flashinfer_problem(device, torch.bfloat16)
    if problem is not None:
        return [Row("attention: flashinfer vs torch", f"flashinfer unavailable: {problem}", Verdict.SKIP)]
    return [compare_backends(("flashinfer", "torch"), device, torch.bfloat16)]
