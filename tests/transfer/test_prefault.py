"""Faulting a receiver's pool in leaves every byte as it was, in any memory the pool may have."""

from __future__ import annotations

import pytest
import torch

from pdserve.kv.host_memory import HUGE_PAGE_BYTES, zeroed_host_tensor
from pdserve.transfer import prefault as prefaulting
from pdserve.transfer.prefault import prefault, prefault_behind


@pytest.mark.parametrize("populate", [True, False], ids=["madvise", "one byte per page"])
def test_prefault_keeps_every_byte_of_plain_and_pool_memory(monkeypatch, populate):
    if not populate:  # a kernel without MADV_POPULATE_WRITE
        monkeypatch.setattr(prefaulting, "_populate", lambda address, nbytes: False)
    for buffer in (torch.empty(3 * 4096 + 17, dtype=torch.uint8), zeroed_host_tensor((2 * HUGE_PAGE_BYTES + 5,),
                                                                                     torch.uint8)):
        buffer.copy_(torch.randint(0, 256, buffer.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3)))
        before = buffer.clone()
        assert prefault(buffer[7:]) in (("populate", "touch") if populate else ("touch",))  # off a page boundary
        assert torch.equal(buffer, before)


def test_a_tensor_off_the_cpu_is_left_alone():
    assert prefault(torch.empty(8192, dtype=torch.uint8, device="meta")) == "none"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("populate", [True, False], ids=["madvise", "one byte per page"])
def test_prefault_behind_keeps_every_byte_and_touches_at_once_without_madvise(monkeypatch, populate):
    if not populate:
        monkeypatch.setattr(prefaulting, "_populate", lambda address, nbytes: False)
    buffer = zeroed_host_tensor((2 * HUGE_PAGE_BYTES + 5,), torch.uint8)
    buffer.copy_(torch.randint(0, 256, buffer.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(4)))
    before = buffer.clone()
    behind = prefault_behind(buffer[7:])
    if populate:
        assert behind.how in ("populate", "touch")  # touch: this kernel lacks madvise's populate
    else:
        assert behind.how == "touch" and behind.thread is None  # done before it returns: it writes bytes
    assert behind.wait(20)
    assert torch.equal(buffer, before)
    assert prefault_behind(torch.empty(8192, dtype=torch.uint8, device="meta")).how == "none"
