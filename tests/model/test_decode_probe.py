"""How many rows a decode step runs fused: the largest probed batch up to which the fused step
was at least as fast at every probe, measured on the model, pool and backend the engine serves
with, and a pass beyond it computed by the modules."""

from __future__ import annotations

import copy

import torch

from pdserve.attention.batched_backend import BatchedTorchBackend
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.cpu.transform import apply_cpu_paths
from pdserve.cpu.weight_layout import PANELS
from pdserve.engine.decode_probe import DecodeTimings, decode_batch, fused_rows, measure_decode, tune_fused_rows
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from tests.helpers.kernels import decode_kernel


def served(tiny_models, name: str = "llama_gqa_llama3"):
    model = copy.deepcopy(tiny_models[name][0].model)
    apply_cpu_paths(model, PANELS, "native", "cpu", torch.float32)
    kv = KVCache(model.config.kv_shape(4), 8, torch.float32, "cpu")
    return model, kv


def test_the_fused_rows_end_at_the_first_batch_where_the_layers_were_faster():
    timings = DecodeTimings((1, 4, 16, 64), fused=(1.0, 2.0, 5.0, 8.0), layers=(2.0, 2.0, 4.0, 9.0))
    assert fused_rows(timings) == 4  # a tie counts for the fused step; 64 is past the first loss
    assert fused_rows(DecodeTimings((1, 4), fused=(3.0, 1.0), layers=(2.0, 2.0))) == 0
    assert DecodeTimings.from_json(timings.to_json()) == timings


def test_a_probe_batch_puts_one_token_of_each_sequence_in_the_pools_blocks():
    batch = decode_batch(5, KVCache(KVShape(num_layers=1, num_kv_heads=1, head_dim=4, block_size=4), 3,
                                    torch.float32, "cpu"))
    assert [s.block_table for s in batch.seqs] == [(0,), (1,), (2,), (0,), (1,)]
    assert batch.slot_mapping.tolist() == [3, 7, 11, 3, 7] and batch.positions.tolist() == [3] * 5


def test_the_probe_times_both_ways_and_leaves_the_fused_step_attached(tiny_models):
    model, kv = served(tiny_models)
    fused = model.fused_decode
    timings = measure_decode(model, kv, BatchedTorchBackend(decode_kernel()), (1, 3))
    assert timings.batches in ((1,), (1, 3)) and all(t > 0 for t in (*timings.fused, *timings.layers))
    assert len(timings.batches) == 2 or timings.fused[0] > timings.layers[0]  # stopped only where fused lost
    assert model.fused_decode is fused


def test_the_probe_stops_at_the_first_batch_where_the_layers_were_faster(tiny_models, monkeypatch):
    from pdserve.engine import decode_probe

    model, kv = served(tiny_models)
    seconds = {1: (1.0, 2.0), 4: (3.0, 2.0), 16: (1.0, 9.0)}  # rows: (fused, layers)
    monkeypatch.setattr(decode_probe, "_time", lambda m, batch, kv, attn:
                        seconds[batch.num_tokens][0 if m.fused_decode is not None else 1])
    timings = measure_decode(model, kv, BatchedTorchBackend(decode_kernel()), (1, 4, 16))
    assert timings == DecodeTimings((1, 4), fused=(1.0, 3.0), layers=(2.0, 2.0))
    assert fused_rows(timings) == 1


def test_tuning_sets_the_rows_from_the_kept_timings_and_skips_a_backend_without_a_native_pass(tiny_models,
                                                                                               monkeypatch, tmp_path):
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    model, kv = served(tiny_models)
    assert tune_fused_rows(model, kv, TorchAttentionBackend(), {"model": "tiny"}) is None
    assert model.fused_decode.max_rows == 0  # no native decode pass to fuse with
    model.fused_decode.max_rows = 256
    timings = tune_fused_rows(model, kv, BatchedTorchBackend(decode_kernel()), {"model": "tiny"})
    assert model.fused_decode.max_rows == fused_rows(timings)
    twin, _ = served(tiny_models)
    assert tune_fused_rows(twin, kv, BatchedTorchBackend(decode_kernel()), {"model": "tiny"}) == timings  # kept
    assert copy.deepcopy(model).fused_decode.max_rows == model.fused_decode.max_rows
