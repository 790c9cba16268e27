"""flashinfer against the torch reference on a mixed batch (CUDA and flashinfer only)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.kv.kv_cache import KVCache
from tests.attention.test_attention_torch import LAYERS, Case, build, new_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="needs flashinfer"),
]

CASES = [Case(0, 37), Case(9, 1), Case(40, 16), Case(0, 1), Case(70, 1), Case(16, 5)]


def cuda_copy(kv: KVCache, dtype: torch.dtype) -> KVCache:
    copy = KVCache(kv.shape, kv.num_blocks, dtype, "cuda")
    copy.data.copy_(kv.data)
    return copy


def to_device(kv, batch, q, keys, values, dtype):
    kv = cuda_copy(kv, dtype)
    names = ("input_ids", "positions", "slot_mapping", "logits_indices")
    fields = {name: getattr(batch, name).cuda() for name in names}
    batch = type(batch)(seqs=batch.seqs, **fields)
    move = lambda d: {i: t.to("cuda", dtype) for i, t in d.items()}  # noqa: E731
    return kv, batch, q.to("cuda", dtype), move(keys), move(values)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shuffle", [False, True])
def test_flashinfer_matches_torch_backend(dtype, shuffle):
    from pdserve.attention.flashinfer_backend import FlashInferBackend

    kv, batch, q, keys, values = to_device(*build(CASES, 8, 2, 64, 16, seed=1, shuffle=shuffle), dtype)
    reference_kv = cuda_copy(kv, dtype)
    flash, reference = FlashInferBackend("cuda"), TorchAttentionBackend()
    flash.begin(batch, kv)
    reference.begin(batch, reference_kv)
    for layer in range(LAYERS):
        k = torch.empty(batch.num_tokens, 2, 64, device="cuda", dtype=dtype)
        v = torch.empty_like(k)
        for i, case in enumerate(CASES):
            k[new_rows(batch, i)] = keys[i][layer, case.cached :]
            v[new_rows(batch, i)] = values[i][layer, case.cached :]
        got = flash.forward(layer, q[layer], k, v, kv)
        expected = reference.forward(layer, q[layer], k, v, reference_kv)
        torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(kv.data, reference_kv.data)


def test_flashinfer_refuses_a_float32_pool():
    from pdserve.attention.flashinfer_backend import FlashInferBackend

    kv, batch, *_ = build([Case(0, 3)], 4, 2, 64, 16, seed=0)
    with pytest.raises(ValueError, match="float16/bfloat16"):
        FlashInferBackend("cuda").begin(batch, cuda_copy(kv, torch.float32))
