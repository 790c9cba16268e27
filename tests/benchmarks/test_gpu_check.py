"""benchmarks/gpu_check.py: without CUDA one line and exit 0; on CPU, every check's code at tiny
sizes (so that the first run on a GPU is not its first run), and the table and exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu.attention import AttentionCase, attention_rows, compare_backends
from benchmarks.gpu.common import Row, Verdict
from benchmarks.gpu.decode_bound import DecodeShape, decode_rows, tiny_raw
from benchmarks.gpu.engine_checks import half_row, swap_row, tensor_parallel_row
from benchmarks.gpu.swap_copy import swap_copy_row
from pdserve.kv.kv_shape import KVShape

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
TINY_CASE = AttentionCase(4, 2, 16, 4, 2, (5, 9, 17), ((3, 6), (0, 5)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the line printed without CUDA")
def test_without_cuda_it_prints_one_line_and_exits_0():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py")], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [gpu_check.NO_CUDA]


def test_two_backends_compared_on_one_mixed_batch():
    row = compare_backends(("torch-batched", "torch"), CPU, torch.float32, TINY_CASE)
    assert row.verdict is Verdict.OK, row.result
    assert "KV pools equal" in row.result and "14 tokens: 3 decodes, 2 chunks" in row.result


def test_flashinfer_comparison_is_skipped_with_the_reason_where_it_cannot_run():
    [row] = attention_rows(CPU)
    assert row.verdict is Verdict.SKIP and "device cpu is not CUDA" in row.result


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dirs) -> str:
    return str(tiny_model_dirs["llama_gqa_llama3"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("half", "tolerance"), [("float32", 0.05), ("bfloat16", 0.3)])
def test_half_precision_against_float32(tiny_model, half, tolerance):
    row = half_row(CPU, tiny_model, half=half, new_tokens=6, questions=("Hello!", "What is the capital of France?"),
                   tolerance=tolerance)
    assert row.verdict is Verdict.OK, row.result
    backend = "torch-batched" if half == "float32" else "torch"  # auto on a CPU
    assert row.check == f"model: {half} ({backend}) vs float32"


@pytest.mark.timeout(300)
def test_deterministic_mode_alone_against_together(tiny_model):
    from benchmarks.gpu.deterministic import deterministic_row

    row = deterministic_row(CPU, tiny_model, new_tokens=6, questions=("Hello!", "Tell me a story about a fox."))
    assert row.verdict is Verdict.OK, row.result
    assert row.check == "deterministic: float32 (query/native)" and "2/2 bitwise equal" in row.result


@pytest.mark.timeout(300)
def test_swap_under_a_tight_pool_keeps_every_token(tiny_model):
    row = swap_row(CPU, tiny_model, new_tokens=12, questions=("Hello!", "Tell me a story about a fox."))
    assert row.verdict is Verdict.OK, row.result
    assert " 0 swaps" not in row.result


def test_swap_copies_round_trip():
    row = swap_copy_row(CPU, KVShape(2, 2, 16, 4), blocks=8)
    assert row.verdict is Verdict.OK and "round trip exact: True" in row.result


def test_tensor_parallel_needs_two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    row = tensor_parallel_row(torch.device("cuda"))
    assert (row.verdict, row.result) == (Verdict.SKIP, "needs 2 GPUs, found 1")


@pytest.mark.timeout(300)
def test_tensor_parallel_two_ranks_equal_one_through_the_engine(tiny_model):
    """On the CPU (gloo), through the same entry point the GPU run uses; the ranks are closed."""
    row = tensor_parallel_row(CPU, tiny_model, new_tokens=6)
    assert (row.verdict, row.result) == (Verdict.OK, "float32 greedy, 3 prompts x 6 tokens: 3/3 equal TP=1")


def test_decode_rows_measure_each_batch_against_the_bound():
    rows = decode_rows(CPU, tiny_raw(), torch.float32, DecodeShape((1, 2), context=24, steps=2), "torch",
                       copy_bytes=1 << 20)
    assert [r.check for r in rows] == ["memory: copy bandwidth", "decode 0.1M float32: batch 1, context 24",
                                       "decode 0.1M float32: batch 2, context 24"]
    assert all("of the bound" in r.result for r in rows[1:])


def test_defaults_on_the_cpu_are_float32_with_torch_batched():
    assert gpu_check.defaults_rows(CPU) == [Row("defaults: --dtype auto, --attention-backend auto",
                                                "float32 with torch-batched", Verdict.OK)]


def test_the_table_has_every_row_and_a_raising_check_fails_the_run(monkeypatch, capsys):
    def broken(device):
        raise RuntimeError("out of memory")

    checks = {"defaults": gpu_check.defaults_rows, "broken": broken}
    monkeypatch.setattr(gpu_check, "CHECKS", checks)
    monkeypatch.setattr(gpu_check, "machine_line", lambda device: "a GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_check.main(["--device", "cpu"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a GPU" and lines[1].split() == ["check", "verdict", "result"]
    assert lines[3].endswith("  ok       float32 with torch-batched")
    assert lines[4].split() == ["broken", *"ERROR RuntimeError: out of memory".split()]
    assert gpu_check.main(["--device", "cpu", "--skip", "broken"]) == 0
