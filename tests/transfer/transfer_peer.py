"""Child-process ends for the cross-process UCX tests (run under multiprocessing spawn)."""

import asyncio

from pdserve.transfer.ucx import UcxConfig, UcxTransport
from tests.transfer.transfer_helpers import SECRET, make_pool

CONFIG = UcxConfig(max_message_bytes=4 * 65536)


def receiver_main(conn, plan, timeout_s):
    """Expect every (transfer_id, seq, pairs) of plan, then send back outcomes and the pool."""
    asyncio.run(_receive(conn, plan, timeout_s))


async def _receive(conn, plan, timeout_s):
    pool = make_pool(fill=False)
    receiver = UcxTransport(CONFIG).receiver(pool)
    pieces = [receiver.expect(tid, seq, pairs, timeout_s, secret=SECRET) for tid, seq, pairs in plan]
    tasks = [asyncio.ensure_future(piece) for piece in pieces]
    conn.send(receiver.address())
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    conn.send(([type(o).__name__ for o in outcomes], pool.numpy().copy()))
    await receiver.close()


def sender_main(conn, plan, timeout_s):
    """Wait for a receiver address and a seed, fill a pool from the seed, send every piece."""
    asyncio.run(_send(conn, plan, timeout_s))


async def _send(conn, plan, timeout_s):
    import torch

    address, seed = conn.recv()
    torch.manual_seed(seed)
    sender = UcxTransport(CONFIG).sender(make_pool(fill=True))
    sends = [sender.send(address, tid, seq, pairs, timeout_s, secret=SECRET) for tid, seq, pairs in plan]
    outcomes = await asyncio.gather(*sends, return_exceptions=True)
    conn.send([type(o).__name__ for o in outcomes])
    await sender.close()
