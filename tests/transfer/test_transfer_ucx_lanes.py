"""UCX lanes: the address that names them, the split both sides derive, and every lane choice moving data."""

import pytest
import torch
from tests.transfer.test_transfer_transports import assert_landed, both, close
from tests.transfer.transfer_helpers import make_pool, run

from pdserve.transfer import TransferError
from pdserve.transfer.descriptors import BlockRun
from pdserve.transfer.ucx import UcxConfig, UcxTransport
from pdserve.transfer.ucx_lanes import assign_lanes, check_lanes, decode_address, encode_address

pytestmark = pytest.mark.timeout(60)


def test_address_round_trips_every_lane():
    lanes = (("pull", b"\x00abc" * 50), ("push", b"xyz"))
    assert decode_address(encode_address(lanes)) == lanes


@pytest.mark.parametrize("blob", [b"", b"PDUCXL1", b"raw ucx worker address", b"PDUCXL1\x01\x00\x09\x00\x00\x00ab",
                                  b"PDUCXL1\x00", b"PDUCXL1\x01\x07\x01\x00\x00\x00a"])
def test_a_malformed_address_is_refused(blob):
    with pytest.raises(ValueError):
        decode_address(blob)


def test_split_balances_blocks_and_is_deterministic():
    messages = [BlockRun(0, 0, 8), BlockRun(8, 20, 8), BlockRun(16, 40, 4), BlockRun(20, 50, 4), BlockRun(30, 60, 1)]
    assert assign_lanes(messages, 1) == (0, 0, 0, 0, 0)
    assert assign_lanes(messages, 2) == (0, 1, 0, 1, 0)
    assert assign_lanes([], 2) == ()


@pytest.mark.parametrize("lanes", [(), ("pull", "pull"), ("sideways",)])
def test_bad_lane_choices_are_refused(lanes):
    with pytest.raises(ValueError):
        check_lanes(lanes)


@pytest.mark.parametrize("lanes", [("pull",), ("push",), ("pull", "push"), ("push", "pull")])
def test_every_lane_choice_moves_a_fragmented_piece(lanes):
    config = UcxConfig(max_message_bytes=2 * 65536, lanes=lanes)

    async def main():
        transport = UcxTransport(config)
        src, dst = make_pool(fill=True), make_pool(fill=False)
        sender, receiver = transport.sender(src), transport.receiver(dst)
        before = dst.clone()
        pairs = [(i, 31 - i) for i in range(0, 12)] + [(12 + i, i) for i in range(8)]
        sent, got = await both(sender, receiver, "lanes", 0, pairs)
        assert_landed(src, dst, pairs, before)
        assert sent.nbytes == got.nbytes == len(pairs) * src[0].numel() * 4
        await close(sender, receiver)

    run(main())


def test_a_sender_without_the_receivers_lane_fails_clearly():
    async def main():
        src, dst = make_pool(fill=True), make_pool(fill=False)
        receiver = UcxTransport(UcxConfig(lanes=("pull", "push"))).receiver(dst)
        sender = UcxTransport(UcxConfig(lanes=("pull",))).sender(src)
        with pytest.raises(TransferError, match="lanes"):
            await sender.send(receiver.address(), "t", 0, [(0, 0)], 2.0)
        await close(sender, receiver)
        return dst

    assert torch.count_nonzero(run(main())) == 0
