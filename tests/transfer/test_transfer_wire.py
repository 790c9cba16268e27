import hashlib

import pytest

from pdserve.transfer import wire
from pdserve.transfer.wire import (
    MANIFEST_INDEX,
    MAX_SEQ,
    TransferKeys,
    encode_manifest,
    manifest_tag,
    message_tag,
    transfer_key,
)


def test_tag_fields_are_stored_not_hashed_within_a_transfer():
    tags = {message_tag("req-1", seq, i) for seq in range(50) for i in range(50)}
    assert len(tags) == 2500
    tag = message_tag("req-1", 3, 7)
    assert tag >> 28 == transfer_key("req-1")
    assert (tag >> 14) & MAX_SEQ == 3 and tag & MANIFEST_INDEX == 7
    assert manifest_tag("req-1", 3) & MANIFEST_INDEX == MANIFEST_INDEX
    assert all(t < 1 << 64 for t in tags)


def test_key_is_a_stable_digest_not_the_process_salted_hash():
    expected = int.from_bytes(hashlib.blake2b(b"req-42", digest_size=8).digest(), "big") >> 28
    assert transfer_key("req-42") == expected


def test_out_of_layout_fields_are_refused():
    with pytest.raises(ValueError):
        message_tag("t", MAX_SEQ + 1, 0)
    with pytest.raises(ValueError):
        message_tag("t", 0, MANIFEST_INDEX + 1)
    with pytest.raises(ValueError):
        wire.check_message_count(MANIFEST_INDEX + 1)


def test_manifest_is_fixed_size_and_names_bytes_and_digest():
    a = encode_manifest(100, b"x" * 16)
    assert len(a) == wire.MANIFEST_NBYTES
    assert a != encode_manifest(101, b"x" * 16)
    assert a != encode_manifest(100, b"y" * 16)


def test_live_ids_with_one_key_are_refused_until_released(monkeypatch):
    monkeypatch.setattr(wire, "transfer_key", lambda transfer_id: 7)
    keys = TransferKeys()
    assert keys.acquire("a") and keys.acquire("a")
    assert not keys.acquire("b")
    keys.release("a")
    assert not keys.acquire("b")
    keys.release("a")
    assert keys.acquire("b")
