import hashlib
import struct

import pytest

from pdserve.transfer import wire
from pdserve.transfer.wire import (
    MANIFEST_INDEX,
    PieceKeys,
    encode_manifest,
    manifest_tag,
    message_tag,
    piece_key,
    piece_tags,
)

SECRET = b"s" * 16


def test_index_is_stored_not_hashed_within_a_piece():
    key = piece_key(SECRET, "req-1", 3)
    tags = piece_tags(key, 50)
    assert len(set(tags)) == 51 and tags[-1] == manifest_tag(key)
    assert all(t >> 14 == key for t in tags)
    assert message_tag(key, 7) & MANIFEST_INDEX == 7
    assert all(t < 1 << 64 for t in tags)


def test_key_is_a_stable_keyed_digest_not_the_process_salted_hash():
    digest = hashlib.blake2b(struct.pack("<I", 42) + b"req-42", key=SECRET, digest_size=8).digest()
    assert piece_key(SECRET, "req-42", 42) == int.from_bytes(digest, "big") >> 14


def test_without_the_secret_no_tag_of_the_piece_can_be_named():
    """Another secret (or none known) gives other keys for every piece of the transfer."""
    mine = {piece_key(SECRET, "req-1", seq) for seq in range(100)}
    theirs = {piece_key(b"t" * 16, "req-1", seq) for seq in range(100)}
    assert len(mine) == 100 and not mine & theirs
    assert piece_key(SECRET, "req-1", 0) != piece_key(SECRET, "req-2", 0)


@pytest.mark.parametrize("secret", [b"", b"short", b"x" * 65, "a str of sixteen chars"])
def test_a_secret_too_short_too_long_or_not_bytes_is_refused(secret):
    with pytest.raises(ValueError):
        piece_key(secret, "t", 0)


def test_out_of_layout_fields_are_refused():
    with pytest.raises(ValueError):
        piece_key(SECRET, "t", wire.MAX_SEQ + 1)
    with pytest.raises(ValueError):
        message_tag(1, MANIFEST_INDEX + 1)
    with pytest.raises(ValueError):
        wire.check_message_count(MANIFEST_INDEX + 1)


def test_manifest_is_fixed_size_and_names_bytes_and_digest():
    a = encode_manifest(100, b"x" * 16)
    assert len(a) == wire.MANIFEST_NBYTES
    assert a != encode_manifest(101, b"x" * 16)
    assert a != encode_manifest(100, b"y" * 16)


def test_a_key_is_held_by_one_live_piece_at_a_time():
    keys, a, b = PieceKeys(), object(), object()
    assert keys.acquire(7, a) and keys.acquire(7, a)
    assert not keys.acquire(7, b)
    keys.release(7, b)  # not b's to release
    assert not keys.acquire(7, b)
    keys.release(7, a)
    assert keys.acquire(7, b) and len(keys) == 1
