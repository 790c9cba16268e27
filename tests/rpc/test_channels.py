"""The internal channels give up on a silent peer within seconds: their keepalive pings, and every
other ping, time out as soon as the keepalive does (grpc-core's own ping timeout is 60 s: a
SIGSTOPped decode worker held its streams that long; benchmarks/stall_detection.py)."""

from __future__ import annotations

from pdserve.rpc.channels import CHANNEL_OPTIONS


def test_every_ping_of_an_internal_channel_times_out_with_the_keepalive():
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.keepalive_time_ms"] <= 2000 and options["grpc.keepalive_timeout_ms"] <= 2000
    assert options["grpc.http2.ping_timeout_ms"] <= options["grpc.keepalive_timeout_ms"]
