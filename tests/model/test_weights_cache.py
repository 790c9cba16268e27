"""The assembled weights kept on disk and mapped by the next load (pdserve/model/weights_cache.py)."""

from __future__ import annotations

import os

import pytest
import torch

from pdserve.model.loader import load_model
from pdserve.model.weights_cache import kept_weights

pytestmark = pytest.mark.timeout(120)


def _state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 5, generator=generator), "b.bias": torch.randn(3, generator=generator),
            "c.half": torch.randn(4, 4, generator=generator).to(torch.bfloat16)}


def _assembler(calls: list[int]):
    def assemble() -> dict[str, torch.Tensor]:
        calls.append(1)
        return _state()
    return assemble


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _mapped_from(tensor: torch.Tensor, cache) -> bool:
    """Whether `tensor`'s bytes lie in a mapping of a file of `cache` (this process's /proc/self/maps)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *_, name = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= address < end and name.strip().startswith(str(cache)):
                return True
    return False


@pytest.fixture()
def source(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"stands for a checkpoint")
    return path


def test_the_second_load_maps_what_the_first_kept(source, tmp_path):
    calls: list[int] = []
    first = kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache")
    second = kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache")
    assert calls == [1] and _equal(first, _state()) and _equal(second, _state())
    assert all(_mapped_from(t, tmp_path / "cache") for t in second.values())
    second["a.weight"].add_(1)  # a private mapping: a write copies its page, the file keeps its bytes
    assert _equal(kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache"), _state())


def test_a_changed_checkpoint_or_dtype_is_assembled_again(source, tmp_path):
    calls: list[int] = []
    kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache")
    kept_weights(source, torch.bfloat16, _assembler(calls), tmp_path / "cache")
    os.utime(source, ns=(1, 1))
    kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache")
    assert calls == [1, 1, 1]


def test_a_truncated_file_is_assembled_again_and_served_right(source, tmp_path):
    calls: list[int] = []
    kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache")
    (data,) = (tmp_path / "cache" / "weights").glob("*.bin")
    data.write_bytes(data.read_bytes()[:40])
    assert _equal(kept_weights(source, torch.float32, _assembler(calls), tmp_path / "cache"), _state())
    assert calls == [1, 1]


def test_an_unwritable_cache_assembles_and_keeps_nothing(source, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    calls: list[int] = []
    assert _equal(kept_weights(source, torch.float32, _assembler(calls), blocked), _state())
    assert _equal(kept_weights(source, torch.float32, _assembler(calls), blocked), _state())
    assert calls == [1, 1]


def test_the_embedded_model_mapped_equals_the_model_dequantised(tmp_path):
    plain = load_model(None).model.state_dict()
    load_model(None, weights_cache=tmp_path)
    mapped = load_model(None, weights_cache=tmp_path).model.state_dict()
    assert _equal(plain, mapped)


def test_keeping_a_new_version_removes_the_old_one_of_that_path_and_dtype_only(source, tmp_path):
    cache = tmp_path / "cache"
    kept_weights(source, torch.float32, _assembler([]), cache)
    kept_weights(source, torch.bfloat16, _assembler([]), cache)
    os.utime(source, ns=(1, 1))
    kept_weights(source, torch.float32, _assembler([]), cache)
    assert len(list((cache / "weights").glob("*.bin"))) == 2  # the new float32 one and the bfloat16 one
