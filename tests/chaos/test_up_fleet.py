"""`UpFleet` reads `pdserve up --status-file`: workers named by role and rank, restarts as generations."""

from __future__ import annotations

import json

from pdserve.chaos.fleet import FleetSpec
from pdserve.chaos.up_fleet import UpFleet

STATUS = {"router": "127.0.0.1:5000", "children": [
    {"name": "prefill-0", "role": "prefill", "pid": 11, "port": 5001, "metrics_port": 6001, "restarts": 0},
    {"name": "decode-1", "role": "decode", "pid": 12, "port": 5002, "metrics_port": 6002, "restarts": 2},
    {"name": "decode-2", "role": "decode", "pid": 13, "port": 5003, "metrics_port": 6003, "restarts": 0},
    {"name": "router", "role": "router", "pid": 14, "port": 5000, "metrics_port": 6000, "restarts": 0}]}


def test_workers_are_named_by_role_and_rank_with_their_ports_and_generations():
    fleet = UpFleet(FleetSpec(prefill=1, decode=2))
    fleet.status_file.write_text(json.dumps(STATUS))
    assert [(w.name, w.role, w.address) for w in fleet.workers()] == [
        ("prefill-0", "prefill", "127.0.0.1:5001"), ("decode-0", "decode", "127.0.0.1:5002"),
        ("decode-1", "decode", "127.0.0.1:5003")]
    assert (fleet.generation("decode-0"), fleet.generation("decode-1")) == (3, 1)
    assert not fleet.restarted("decode-0", 3)


def test_the_command_passes_the_fleet_and_the_status_file():
    fleet = UpFleet(FleetSpec(prefill=2, decode=3, kv_blocks=128, kv_timeout_s=12.0))
    argv = fleet.argv()
    for flag, value in (("--prefill-workers", "2"), ("--decode-workers", "3"), ("--kv-blocks", "128"),
                        ("--kv-timeout", "12.0"), ("--drain-timeout-s", "10.0"),
                        ("--status-file", str(fleet.status_file)), ("--anonymous-max-priority", "vip")):
        assert argv[argv.index(flag) + 1] == value
    assert argv[argv.index("up") - 1] == "pdserve.cli.main"
