"""The router's Registry: refuses malformed registrations, keys workers by address (a second
Register is a heartbeat), is capped, and the channel of a registered worker that left is closed."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.errors import InvalidRequestError, OverloadedError
from pdserve.rpc.channels import ChannelPool
from router.fleet.discovery import RegistryServicer
from router.fleet.grpc_clients import GrpcWorkerClients
from router.fleet.workers import PoolConfig, WorkerPool

pytestmark = pytest.mark.timeout(60)


def _registry(max_workers: int = 3, static: tuple[str, ...] = ()) -> RegistryServicer:
    pool = WorkerPool(GrpcWorkerClients(ChannelPool()), [], list(static))
    return RegistryServicer(pool, max_workers)


def test_a_second_register_of_an_address_is_a_heartbeat_not_a_new_worker():
    registry = _registry()
    for _ in range(5):
        registry.admit("10.0.0.1:50061", "prefill")
    assert registry.registered() == 1 and registry.pool.workers["10.0.0.1:50061"].source == "registry"


def test_registrations_beyond_the_cap_are_refused_and_known_ones_still_heartbeat():
    registry = _registry(max_workers=2, static=("10.0.0.9:50071",))
    registry.admit("10.0.0.1:50061", "prefill")
    registry.admit("10.0.0.2:50071", "decode")
    with pytest.raises(OverloadedError, match="--max-registered-workers"):
        registry.admit("10.0.0.3:50071", "decode")
    registry.admit("10.0.0.1:50061", "prefill")
    assert set(registry.pool.workers) == {"10.0.0.9:50071", "10.0.0.1:50061", "10.0.0.2:50071"}


@pytest.mark.parametrize("address, role", [
    ("", "decode"), ("10.0.0.1", "decode"), ("10.0.0.1:0", "decode"), ("10.0.0.1:99999", "decode"),
    ("evil host:50071", "decode"), ("h" * 300 + ":1", "decode"), ("10.0.0.1:50071", "router"),
    ("10.0.0.9:50071", "prefill"),  # a static decode worker's address cannot turn prefill
])
def test_malformed_or_conflicting_registrations_are_refused_with_nothing_added(address, role):
    registry = _registry(static=("10.0.0.9:50071",))
    with pytest.raises(InvalidRequestError):
        registry.admit(address, role)
    assert set(registry.pool.workers) == {"10.0.0.9:50071"}


def test_ipv6_and_names_are_addresses():
    registry = _registry()
    registry.admit("[::1]:50061", "prefill")
    registry.admit("decode-0.pdserve-decode:50071", "decode")
    assert registry.registered() == 2


def test_a_registered_worker_that_stops_answering_leaves_and_its_channel_is_closed():
    async def main():
        channels = ChannelPool()
        pool = WorkerPool(GrpcWorkerClients(channels), [], [], PoolConfig(poll_s=0.05, poll_timeout_s=0.2,
                                                                           forget_after=2))
        RegistryServicer(pool).admit("127.0.0.1:9", "decode")  # nothing listens there
        pool.start()
        try:
            for _ in range(200):
                if not pool.workers and "127.0.0.1:9" not in channels._channels:
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            await pool.stop()
            await channels.close()

    assert asyncio.run(main())


def test_a_worker_registering_with_another_model_is_incompatible_before_its_first_poll():
    from pdserve.identity import ModelFingerprint, WorkerIdentity
    from pdserve.rpc.stats import identity_to_pb
    from pdserve.v1 import worker_pb2 as wpb

    model = ModelFingerprint("w", "a", "t")
    found = []
    pool = WorkerPool(GrpcWorkerClients(ChannelPool()), [], [], model=model, on_incompatible=found.append)
    registry = RegistryServicer(pool, 4)
    other = WorkerIdentity(ModelFingerprint("w2", "a", "t"), "torch.float32", 16)
    same = WorkerIdentity(model, "torch.float32", 16)
    for address, identity in (("10.0.0.1:50061", other), ("10.0.0.2:50061", same)):
        request = wpb.RegisterRequest(address=address, role="decode", identity=identity_to_pb(identity))
        asyncio.run(registry.Register(request, None))
    assert pool.workers["10.0.0.1:50061"].incompatible == ("weights",)
    assert pool.workers["10.0.0.2:50061"].incompatible == ()
    assert [w.address for w in found] == ["10.0.0.1:50061"]
