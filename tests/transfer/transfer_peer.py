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




def main() -> None:
    """An end as a command, run on a test host by `ip netns exec` (lines of JSON on stdout):

    python -m tests.transfer.transfer_peer receiver OUT.npy TIMEOUT PLAN   prints its address (hex),
        then the pieces' outcomes once all ended, and leaves the pool in OUT.npy
    python -m tests.transfer.transfer_peer sender SEED TIMEOUT PLAN CONNECT_S   reads an address
        (hex) on stdin, sends PLAN from a pool filled from SEED, prints each piece's outcome
        (its type and message) and the paths it chose for its peers
    """
    import json
    import sys

    role, arg, timeout_s, plan = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4])
    plan = [(t, s, [tuple(p) for p in pairs]) for t, s, pairs in plan]
    if role == "receiver":
        receiver_main(_Lines(arg), plan, timeout_s)
    else:
        asyncio.run(_send_lines(int(arg), plan, timeout_s, float(sys.argv[5])))


class _Lines:
    """The receiver's end of the pipe, as lines on stdout."""

    def __init__(self, out: str):
        self.out = out

    def send(self, value) -> None:
        import json

        import numpy as np

        if isinstance(value, bytes):
            print(value.hex(), flush=True)
            return
        outcomes, pool = value
        np.save(self.out, pool)
        print(json.dumps(outcomes), flush=True)


async def _send_lines(seed: int, plan, timeout_s: float, connect_s: float) -> None:
    import dataclasses
    import json
    import sys

    import torch

    address = bytes.fromhex(sys.stdin.readline().strip())
    torch.manual_seed(seed)
    sender = UcxTransport(dataclasses.replace(CONFIG, connect_s=connect_s)).sender(make_pool(fill=True))
    sends = [sender.send(address, tid, seq, pairs, timeout_s, secret=SECRET) for tid, seq, pairs in plan]
    outcomes = await asyncio.gather(*sends, return_exceptions=True)
    print(json.dumps({"outcomes": [[type(o).__name__, str(o)] for o in outcomes],
                      "paths": [p.path.value for p in sender.paths.values()], "peers": len(sender._peers)}),
          flush=True)
    await sender.close()


if __name__ == "__main__":
    main()
