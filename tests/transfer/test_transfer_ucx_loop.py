"""The UCX transport shares the asyncio loop: big pieces must not hold it for their whole copy."""

import asyncio

import pytest
import torch

from pdserve.transfer.ucx import UcxConfig, UcxTransport
from tests.transfer.transfer_helpers import SECRET, make_pool, run

pytestmark = pytest.mark.timeout(60)


def test_a_32_mib_piece_yields_to_other_tasks_between_messages():
    config = UcxConfig(max_message_bytes=512 << 10, slice_s=0.0)
    blocks = 512  # 64 KiB each: 32 MiB in 64 messages

    async def main():
        transport = UcxTransport(config)
        src, dst = make_pool(fill=True, num_blocks=blocks), make_pool(fill=False, num_blocks=blocks)
        sender, receiver = transport.sender(src), transport.receiver(dst)
        pairs = [(i, i) for i in range(blocks)]
        ticks = 0
        transfer = asyncio.gather(receiver.expect("big", 0, pairs, 30.0, secret=SECRET),
                                  sender.send(receiver.address(), "big", 0, pairs, 30.0, secret=SECRET))
        while not transfer.done():
            ticks += 1
            await asyncio.sleep(0)
        received, _ = await transfer
        await sender.close()
        await receiver.close()
        return ticks, received, src, dst

    ticks, received, src, dst = run(main())
    assert torch.equal(dst, src)
    assert received.nbytes == 32 << 20
    assert ticks >= 32
