"""Layers with a sliding window and their own score scale (LayerAttention, Gemma 3's local layers)
in every CPU backend against dense float64 attention: each query sees its last W positions, in one
pass beside a full layer, over fresh prompts shorter and longer than the window, chunks after a
cached prefix crossing it, and decodes inside and past it. The C decode kernel, which attends whole
contexts only, serves the full layer alone; flashinfer is asked for the window by its plan."""

from __future__ import annotations

import sys

import pytest
import torch

from pdserve.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.native.paged_decode import load_native_decode
from tests.attention.recording_flashinfer import RecordingFlashInfer
from tests.attention.test_attention_torch import LAYERS, Case, build, new_rows
from tests.attention.test_flashinfer_signatures import FLOOR_PARAMS, WRAPPER

WINDOW = 5
KINDS = (LayerAttention(window=WINDOW, scale=0.3), FULL_ATTENTION)  # layer 0 windowed, layer 1 full
CASES = [Case(0, 12), Case(7, 1), Case(20, 9), Case(0, 1), Case(33, 1), Case(3, 1), Case(9, 30), Case(0, 4),
         Case(2, 2)]
assert len(KINDS) == LAYERS


def naive_windowed(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int,
                   kind: LayerAttention) -> torch.Tensor:
    """q: [Q, H, D] at positions first..; keys/values: [C, Hkv, D]. Query i sees positions
    (p - window, p] of p = first + i, scores times kind.scale (1/sqrt(D) where None)."""
    heads, kv_heads, dim = q.shape[1], keys.shape[1], q.shape[2]
    scale = dim**-0.5 if kind.scale is None else kind.scale
    out = torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        end = first + i + 1
        start = 0 if kind.window is None else max(0, end - kind.window)
        for h in range(heads):
            k = keys[start:end, h // (heads // kv_heads)].double()
            weights = torch.softmax(k @ q[i, h].double() * scale, dim=0)
            out[i, h] = weights @ values[start:end, h // (heads // kv_heads)].double()
    return out


def backend(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchAttentionBackend()
    native = load_native_decode().kernel if name == "batched-native" else None
    if name == "batched-native" and native is None:
        pytest.skip("the C decode kernel does not build here")
    return BatchedTorchBackend(native)


def run_pass(attention: AttentionBackend, cases: list[Case], kinds, seed: int, shuffle: bool = False) -> None:
    kv, batch, q, keys, values = build(cases, 8, 2, 16, 4, seed, shuffle)
    attention.begin(batch, kv, kinds)
    for layer, kind in enumerate(kinds):
        k = torch.empty(batch.num_tokens, 2, 16)
        v = torch.empty_like(k)
        for i, case in enumerate(cases):
            k[new_rows(batch, i)] = keys[i][layer, case.cached:]
            v[new_rows(batch, i)] = values[i][layer, case.cached:]
        out = attention.forward(layer, q[layer], k, v, kv)
        for i, case in enumerate(cases):
            expected = naive_windowed(q[layer][new_rows(batch, i)], keys[i][layer], values[i][layer], case.cached, kind)
            torch.testing.assert_close(out[new_rows(batch, i)].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["torch", "batched-sparse", "batched-native"])
@pytest.mark.parametrize("seed", range(2))
def test_a_windowed_layer_beside_a_full_one_matches_dense(name, seed):
    run_pass(backend(name), CASES, KINDS, seed, shuffle=seed == 1)


@pytest.mark.parametrize("name", ["torch", "batched-sparse", "batched-native"])
def test_decodes_alone_with_the_window_everywhere(name):
    run_pass(backend(name), [Case(40, 1), Case(2, 1), Case(6, 1), Case(4, 1)], (KINDS[0], KINDS[0]), seed=5)


def test_the_c_kernel_serves_no_fused_pass_of_windowed_layers():
    native = load_native_decode().kernel
    if native is None:
        pytest.skip("the C decode kernel does not build here")
    kv, batch, *_ = build([Case(9, 1), Case(3, 1)], 8, 2, 16, 4, seed=1)
    attention = BatchedTorchBackend(native)
    attention.begin(batch, kv, KINDS)
    assert attention.native_decode_pass() is None
    attention.begin(batch, kv, (FULL_ATTENTION, FULL_ATTENTION))
    assert attention.native_decode_pass() is not None


def test_flashinfer_is_asked_for_the_window_and_scale(monkeypatch):
    recorder = RecordingFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", recorder)
    from pdserve.attention.flashinfer_backend import FlashInferBackend

    kv, batch, q, _, _ = build([Case(0, 5), Case(6, 1)], 4, 2, 16, 4, seed=0)
    kv.data = kv.data.to(torch.bfloat16)
    attention = FlashInferBackend("cpu")
    attention.begin(batch, kv, KINDS)
    for layer in range(LAYERS):
        k = torch.zeros(batch.num_tokens, 2, 16, dtype=torch.bfloat16)
        attention.forward(layer, q[layer].bfloat16(), k, k.clone(), kv)
    assert [c.target for c in recorder.calls] == [WRAPPER, WRAPPER, f"{WRAPPER}.plan", f"{WRAPPER}.run",
                                                  f"{WRAPPER}.plan", f"{WRAPPER}.run"]
    windowed, full = [c.kwargs for c in recorder.calls if c.target == f"{WRAPPER}.plan"]
    assert (windowed["window_left"], windowed["sm_scale"]) == (WINDOW - 1, 0.3)
    assert "window_left" not in full and "sm_scale" not in full
    for call in recorder.calls:
        FLOOR_PARAMS[call.target].signature().bind(*call.args, **call.kwargs)
