"""UCX between two processes: the decode side in one, the prefill side in the other."""

import asyncio
import multiprocessing

import pytest
import torch

from pdserve.transfer import TransferError, TransferTimeout
from pdserve.transfer.ucx import UcxTransport
from tests.transfer import transfer_peer
from tests.transfer.transfer_helpers import SECRET, make_pool, run

pytestmark = pytest.mark.timeout(90)

PLAN = [("req-a", 0, [(i, 31 - i) for i in range(8)]),
        ("req-a", 1, [(8 + i, 10 + i) for i in range(9)]),
        ("req-b", 0, [(20, 0), (21, 1), (25, 2)])]
UNTOUCHED = [b for b in range(32) if b not in {d for _, _, pairs in PLAN for _, d in pairs}]


@pytest.fixture
def spawn():
    ctx = multiprocessing.get_context("spawn")
    started = []

    def start(target, *args):
        parent, child = ctx.Pipe()
        process = ctx.Process(target=target, args=(child, *args), daemon=True)
        process.start()
        started.append(process)
        return process, parent

    yield start
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(10)
        assert not process.is_alive()


def receive(conn, timeout_s=30.0):
    assert conn.poll(timeout_s), "child process did not answer"
    return conn.recv()


def test_child_receiver_gets_exactly_the_planned_blocks(spawn):
    process, conn = spawn(transfer_peer.receiver_main, PLAN, 20.0)
    address = receive(conn)
    torch.manual_seed(0)
    src = make_pool(fill=True)

    async def main():
        sender = UcxTransport(transfer_peer.CONFIG).sender(src)
        results = await asyncio.gather(*(sender.send(address, t, s, p, 20.0, secret=SECRET) for t, s, p in PLAN))
        await sender.close()
        return results

    results = run(main())
    assert [r.nbytes for r in results] == [8 * 65536, 9 * 65536, 3 * 65536]
    outcomes, pool = receive(conn)
    assert outcomes == ["TransferResult"] * 3
    dst = torch.from_numpy(pool)
    for _, _, pairs in PLAN:
        for s, d in pairs:
            assert torch.equal(dst[d], src[s])
    assert not dst[UNTOUCHED].any()
    process.join(10)
    assert process.exitcode == 0


def test_child_sender_fills_this_receiver(spawn):
    process, conn = spawn(transfer_peer.sender_main, PLAN, 20.0)

    async def main():
        dst = make_pool(fill=False)
        receiver = UcxTransport(transfer_peer.CONFIG).receiver(dst)
        pieces = [asyncio.ensure_future(receiver.expect(t, s, p, 20.0, secret=SECRET)) for t, s, p in PLAN]
        conn.send((receiver.address(), 7))
        results = await asyncio.gather(*pieces)
        await receiver.close()
        return dst, results

    dst, results = run(main())
    assert receive(conn) == ["TransferResult"] * 3
    torch.manual_seed(7)
    src = make_pool(fill=True)
    for _, _, pairs in PLAN:
        for s, d in pairs:
            assert torch.equal(dst[d], src[s])
    assert [r.transfer_id for r in results] == ["req-a", "req-a", "req-b"]


def test_send_to_a_killed_receiver_fails_within_its_timeout(spawn):
    process, conn = spawn(transfer_peer.receiver_main, [("warm", 0, [(0, 0)]), ("never", 0, [(1, 1)])], 60.0)
    address = receive(conn)

    async def main():
        sender = UcxTransport(transfer_peer.CONFIG).sender(make_pool(fill=True))
        await sender.send(address, "warm", 0, [(0, 0)], 10.0, secret=SECRET)
        process.kill()
        process.join(10)
        with pytest.raises(TransferError) as raised:
            await sender.send(address, "never", 0, [(1, 1), (2, 2)], 1.0, secret=SECRET)
        await sender.close()
        return raised.value

    error = run(main())
    print(f"{type(error).__name__}: {error}")
    # a failure UCX reports (the peer is gone), or the send's own deadline: never a wait beyond it
    assert not isinstance(error, TransferTimeout) or "not delivered by the deadline" in str(error), error
