"""Tag layout and the end-of-piece manifest for tag-matched transports (no UCX import here).

A 64-bit tag names one message of one piece:

     63                                             14 13              0
    +-------------------------------------------------+-----------------+
    | key(secret; transfer_id, seq): 50 bits           | index: 14 bits  |
    +-------------------------------------------------+-----------------+

key is the top 50 bits of blake2b keyed with the transfer's secret over (seq, transfer_id): the
decode worker draws the secret at random for each reservation and gives it only to the prefill
worker that fills it, so a sender without it cannot name the tag of any posted receive (its
messages stay unmatched, never copied into the pool). The same in every process (unlike `hash`).
Within one piece tags never collide: index is stored, not hashed. Across live pieces the
receiver refuses a piece whose key equals a live piece's key (`PieceKeys`), so two pieces it
has posted can never share a tag. index MANIFEST_INDEX is the manifest.

The manifest is the last message of a piece, sent only after every data message completed. The
receiver completes a piece only when the manifest arrived and equals what it expects (magic,
byte count, digest of runs and block size): a sender with another layout or block size fails the
piece instead of passing, and a sender that gave up never sends it.
"""

from __future__ import annotations

import hashlib
import struct

KEY_BITS = 50
INDEX_BITS = 14
MAX_SEQ = (1 << 32) - 1
MANIFEST_INDEX = (1 << INDEX_BITS) - 1
MAX_MESSAGES = MANIFEST_INDEX
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 64  # blake2b's longest key

_MAGIC = b"PDKV0001"
_MANIFEST = struct.Struct("<8sQ16s")
MANIFEST_NBYTES = _MANIFEST.size
_SEQ = struct.Struct("<I")


def check_secret(secret: bytes) -> None:
    """ValueError unless `secret` can key a transfer's tags."""
    if not isinstance(secret, bytes) or not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ValueError(f"a transfer secret is {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes")


def piece_key(secret: bytes, transfer_id: str, seq: int) -> int:
    """The tag key of piece `seq` of `transfer_id`; ValueError outside the layout."""
    check_secret(secret)
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"seq {seq} outside 0..{MAX_SEQ}")
    message = _SEQ.pack(seq) + transfer_id.encode("utf-8")
    digest = hashlib.blake2b(message, key=secret, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - KEY_BITS)


def message_tag(key: int, index: int) -> int:
    """Tag of data message `index` (0-based) of the piece with `key`; ValueError outside the layout."""
    if not 0 <= index <= MANIFEST_INDEX:
        raise ValueError(f"a piece holds at most {MAX_MESSAGES} messages")
    return (key << INDEX_BITS) | index


def manifest_tag(key: int) -> int:
    return message_tag(key, MANIFEST_INDEX)


def piece_tags(key: int, count: int) -> list[int]:
    """The tags of a piece of `count` data messages, its manifest's last."""
    check_message_count(count)
    return [message_tag(key, i) for i in range(count)] + [manifest_tag(key)]


def check_message_count(count: int) -> None:
    if count > MAX_MESSAGES:
        raise ValueError(f"{count} messages in one piece; at most {MAX_MESSAGES} (raise max_message_bytes)")


def encode_manifest(nbytes: int, digest: bytes) -> bytes:
    return _MANIFEST.pack(_MAGIC, nbytes, digest)


class PieceKeys:
    """Tag keys of the live pieces of one receiver: a key is held by one piece at a time."""

    def __init__(self) -> None:
        self._owners: dict[int, object] = {}

    def acquire(self, key: int, owner: object) -> bool:
        return self._owners.setdefault(key, owner) is owner

    def release(self, key: int, owner: object) -> None:
        if self._owners.get(key) is owner:
            del self._owners[key]

    def __len__(self) -> int:
        return len(self._owners)
