"""Which UCX transports a sender may use towards a peer (pdserve/transfer/ucx_paths.py)."""

import pytest

from pdserve.transfer.ucx_paths import (
    Locality,
    Path,
    choose_path,
    context_options,
    describe_path,
    split_address,
    with_locality,
)
from pdserve.transfer.ucx_worker import check_peer_address
from pdserve.transfer import TransferError

pytestmark = pytest.mark.timeout(30)

HERE, THERE = Locality(bytes(16)), Locality(bytes(15) + b"\x01")
UCX_ADDRESS = bytes([0x20]) + bytes(range(1, 100))


def test_shared_memory_only_for_a_peer_that_shares_boot_and_namespaces():
    assert choose_path(HERE, HERE) is Path.HOST
    assert choose_path(HERE, THERE) is Path.NETWORK
    assert choose_path(HERE, None) is Path.NETWORK  # an address without a locality: the path that works anywhere


def test_the_network_path_leaves_out_shared_memory_unless_the_operator_chose_the_transports():
    assert context_options(Path.NETWORK, {}, {}) == {"TLS": "^sm"}
    assert context_options(Path.HOST, {}, {}) == {}
    assert context_options(Path.NETWORK, {"TLS": "rc,tcp"}, {}) == {"TLS": "rc,tcp"}
    assert context_options(Path.NETWORK, {}, {"UCX_TLS": "tcp"}) == {}  # UCX reads its own variable
    assert describe_path(Path.NETWORK, {}, {"UCX_TLS": "tcp"}).fixed
    assert "as configured" in str(describe_path(Path.NETWORK, {}, {"UCX_TLS": "tcp"}))


def test_a_locality_travels_in_front_of_the_ucx_address_and_comes_off_whole():
    address = with_locality(THERE, UCX_ADDRESS)
    assert split_address(address) == (THERE, UCX_ADDRESS)
    assert split_address(UCX_ADDRESS) == (None, UCX_ADDRESS)
    with pytest.raises(TransferError, match="format 15"):  # never taken for a bare UCX address
        check_peer_address(address, UCX_ADDRESS)


def test_this_process_has_one_locality_and_a_forged_proc_another(tmp_path):
    assert Locality.of_this_process() == Locality.of_this_process()
    assert Locality.of_this_process(str(tmp_path)) != Locality.of_this_process()
