"""UCX's memory events are turned off only where nothing needs them: a KV pool in host memory, no
RDMA device, and the operator said nothing."""

from __future__ import annotations

import pytest

from pdserve.transfer.ucx_env import without_memory_events


@pytest.mark.timeout(10)
def test_memory_events_go_only_where_no_transport_registers_memory(tmp_path):
    none, devices = tmp_path / "missing", tmp_path / "infiniband"
    devices.mkdir()
    (devices / "mlx5_0").mkdir()
    environ: dict[str, str] = {}
    assert without_memory_events(environ, pool_on_cpu=True, rdma_devices=none)
    assert environ == {"UCX_MEM_EVENTS": "no"}
    for kept, on_cpu, folder in (({}, True, devices), ({}, False, none), ({"UCX_MEM_EVENTS": "yes"}, True, none)):
        environ = dict(kept)
        assert not without_memory_events(environ, pool_on_cpu=on_cpu, rdma_devices=folder)
        assert environ == kept
