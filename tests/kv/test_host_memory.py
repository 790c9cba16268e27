"""Host KV memory: zeroed, the requested shape, aligned to a huge page, alive as long as a view is."""

import gc

import pytest
import torch

from pdserve.kv.host_memory import HUGE_PAGE_BYTES, zeroed_host_tensor
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("shape", [(3, 1 << 20), (5, 7), (1, 1 << 19)])
def test_a_zeroed_host_tensor_is_contiguous_zeros_of_the_shape(shape):
    tensor = zeroed_host_tensor(shape, torch.float32)
    assert tensor.shape == shape and tensor.dtype == torch.float32 and tensor.is_contiguous()
    assert torch.count_nonzero(tensor) == 0


def test_a_big_tensor_starts_on_a_huge_page_and_outlives_its_mapping_object():
    tensor = zeroed_host_tensor((4, 1 << 20), torch.float32)
    assert tensor.data_ptr() % HUGE_PAGE_BYTES == 0
    view = tensor[1:]
    del tensor
    gc.collect()
    view.fill_(2.0)
    assert float(view.sum()) == 2.0 * 3 * (1 << 20)


def test_a_cpu_kv_pool_starts_zeroed():
    cache = KVCache(KVShape(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16), 300, torch.float32, "cpu")
    assert torch.count_nonzero(cache.data) == 0
    assert cache.data.is_contiguous()


def test_a_fresh_pool_commits_no_memory_until_written():
    tensor = zeroed_host_tensor((64, 1 << 20), torch.float32)  # 256 MiB
    assert _smaps_kib(tensor.data_ptr(), "Rss") < 4096
    tensor[:8].fill_(1.0)  # 32 MiB
    assert 32 * 1024 <= _smaps_kib(tensor.data_ptr(), "Rss") < 40 * 1024


def _smaps_kib(address: int, field: str) -> int:
    value = _smaps_field(address, field)
    assert value is not None and value.endswith(" kB"), value
    return int(value.split()[0])


def _thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "never"


def _smaps_field(address: int, field: str) -> str | None:
    start = end = None
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            start, end = lo, hi
        elif start is not None and start <= address < end and line.startswith(field + ":"):
            return line.split(":", 1)[1].strip()
    return None


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="transparent huge pages are off here")
def test_a_big_tensor_is_eligible_for_huge_pages():
    tensor = zeroed_host_tensor((4, 1 << 20), torch.float32)
    assert _smaps_field(tensor.data_ptr(), "THPeligible") == "1"
