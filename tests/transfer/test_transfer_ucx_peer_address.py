"""A peer address UCX could not unpack is refused before UCX sees it (UCX asserts, aborting the
process, on one whose format version is not its own)."""

import pytest

from pdserve.transfer import TransferError
from pdserve.transfer.ucx_worker import check_peer_address

pytestmark = pytest.mark.timeout(30)

OWN = bytes([0x20]) + bytes(range(1, 217))


def test_an_address_of_this_format_passes():
    check_peer_address(bytes([0x30]) + bytes(40), OWN)  # other header flags, the same format version


@pytest.mark.parametrize("peer, why", [(bytes([0x8E]) + bytes(40), "format 14"), (OWN[:15], "15 bytes"),
                                       (b"", "0 bytes")])
def test_an_address_ucx_could_not_unpack_is_a_transfer_error(peer, why):
    with pytest.raises(TransferError, match=why):
        check_peer_address(peer, OWN)
