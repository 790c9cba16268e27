"""The relay benchmark's parts (benchmarks/relay.py): the fake decode worker behind the real router
(colocated), one short stream through each door, the send log joined to the receipts."""

from __future__ import annotations

import asyncio
import os

import pytest

from pdserve.bench import fake_workers
from pdserve.bench.fake_workers import SendLogReader, relay_id, word_ids
from pdserve.bench.relay_clients import GrpcDoor, HttpDoor, Load, Stream, in_order, router_added_ms, run_load
from pdserve.tokenizer import load_tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.small_fleet, pytest.mark.timeout(30)]

TOKENS = 6


def _relay(workdir, *router_flags: str):
    """The fake decode worker and a real router in front of it; stopped when the generator closes."""
    from pdserve.procs.health import wait_serving
    from pdserve.procs.supervisor import Supervisor

    fake = fake_workers.start_process(workdir, workdir / "sent.jsonl")
    sup = Supervisor(env={**os.environ, "HF_HUB_OFFLINE": "1"}, workdir=workdir)
    try:
        router = sup.spawn("router", ["router", "--port", "0", "--http-port", "0", "--colocated", "--insecure",
                                      "--decode-workers", fake.address, "--canary-interval-s", "0", *router_flags])
        target = f"127.0.0.1:{sup.wait_ready(router, 20)}"
        wait_serving(target, 10)
        yield {"target": target, "http": f"http://127.0.0.1:{router.http_port}", "log": workdir / "sent.jsonl",
               "fake": fake, "router": router}
    finally:
        sup.stop()
        fake.stop()


@pytest.fixture(scope="module")
def relay(tmp_path_factory):
    yield from _relay(tmp_path_factory.mktemp("relay"))


@pytest.fixture(scope="module")
def plain_relay(tmp_path_factory):
    """The router without event feeds: every stream's events on its own Decode call."""
    yield from _relay(tmp_path_factory.mktemp("plain-relay"), "--event-feeds", "off")


@pytest.fixture(scope="module")
def paced_relay(tmp_path_factory):
    """The router with --stream-interval 3: a message per 3 tokens after the first."""
    yield from _relay(tmp_path_factory.mktemp("paced-relay"), "--stream-interval", "3")


@pytest.fixture(scope="module")
def ids() -> tuple[int, ...]:
    return word_ids(load_tokenizer(None))


def _one(relay: dict, door: str, request_id: str, ids: tuple[int, ...]) -> Stream:
    """One stream of TOKENS tokens through `door` of `relay`, once the fake worker is idle again."""
    async def run() -> Stream:
        opened = GrpcDoor(relay["target"]) if door == "grpc" else await HttpDoor.open(relay["http"])
        stream = Stream(request_id)
        try:
            await opened.stream(stream, list(ids[:4]), TOKENS)
        finally:
            await opened.close()
        return stream

    stream = asyncio.run(run())
    relay["fake"].wait_idle()
    return stream


def test_the_word_ids_decode_to_the_words(ids):
    assert load_tokenizer(None).decode(list(ids[:3])) == " the quick brown"


def test_a_request_id_carries_its_pace():
    assert fake_workers.interval_of(fake_workers.client_id(relay_id(0.0025, "g1.0") + "@1.ab12"), 1.0) == 0.0025
    assert fake_workers.interval_of("another-id", 1.0) == 1.0


@pytest.mark.parametrize("feeds", [True, False])
@pytest.mark.parametrize("door", ["grpc", "http"])
def test_a_stream_through_each_door_arrives_whole_and_in_order(request, ids, door, feeds):
    relay = request.getfixturevalue("relay" if feeds else "plain_relay")
    stream = _one(relay, door, relay_id(0.002, f"test-{door}-{feeds}"), ids)
    assert stream.finish == "length"
    assert len(stream.received) == TOKENS and in_order(stream, ids)
    assert stream.received == sorted(stream.received)
    if door == "grpc":
        assert stream.token_ids == list(ids[:TOKENS])
    else:
        assert "".join(stream.text) == " the quick brown fox jumps over"
    sent = SendLogReader(relay["log"]).read_new()[stream.request_id]
    assert len(sent) == TOKENS and all(0 < t - s < 5e9 for s, t in zip(sent, stream.received))
    assert sent[-1] - sent[0] >= (TOKENS - 1) * 0.002 * 1e9 * 0.9  # paced as the id asked


def test_a_short_load_measures_the_router_and_joins_the_send_log(relay, ids):
    async def run() -> dict:
        door = GrpcDoor(relay["target"])
        try:
            load = Load("grpc", 4, 400.0, 10, 0.2, 0.5, "load-")
            return await run_load(door, load, {"router": relay["router"].pid, "fake": relay["fake"].pid}, ids)
        finally:
            await door.close()

    result = asyncio.run(run())
    relay["fake"].wait_idle()
    assert not result["errors"] and not result["disordered"]
    assert result["cpu_s"]["router"] > 0 and set(result["cpu_s"]) == {"router", "fake", "client", "machine"}
    added = router_added_ms(result, SendLogReader(relay["log"]).read_new())
    assert 100 <= len(added) and all(0 < ms < 5000 for ms in added)


@pytest.mark.parametrize("door", ["grpc", "http"])
def test_with_a_stream_interval_each_door_gets_the_same_tokens_in_fewer_messages(paced_relay, ids, door):
    stream = _one(paced_relay, door, relay_id(0.002, f"paced-{door}"), ids)
    assert stream.finish == "length" and len(stream.received) == TOKENS and in_order(stream, ids)
    # the first token, one message of 3, the last 2 with the finish: a message's tokens share its receipt time
    assert len(set(stream.received)) <= 3
