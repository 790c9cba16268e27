"""Tag layout and the end-of-piece manifest for tag-matched transports (no UCX import here).

A 64-bit tag names one message of one piece:

     63                               28 27             14 13              0
    +-----------------------------------+-----------------+-----------------+
    | key(transfer_id): 36 bits          | seq: 14 bits    | index: 14 bits  |
    +-----------------------------------+-----------------+-----------------+

key is the top 36 bits of blake2b(transfer_id), the same in every process (unlike `hash`).
Within one transfer, tags never collide: seq and index are stored, not hashed. Across live
transfers the receiver refuses a transfer whose key equals a live transfer's key (`TransferKeys`),
so two pieces it has posted can never share a tag. index MANIFEST_INDEX is the manifest.

The manifest is the last message of a piece, sent only after every data message completed. The
receiver completes a piece only when the manifest arrived and equals what it expects (magic,
byte count, digest of runs and block size): a sender with another layout or block size fails the
piece instead of passing, and a sender that gave up never sends it.
"""

from __future__ import annotations

import hashlib
import struct

KEY_BITS = 36
SEQ_BITS = 14
INDEX_BITS = 14
MAX_SEQ = (1 << SEQ_BITS) - 1
MANIFEST_INDEX = (1 << INDEX_BITS) - 1
MAX_MESSAGES = MANIFEST_INDEX

_MAGIC = b"PDKV0001"
_MANIFEST = struct.Struct("<8sQ16s")
MANIFEST_NBYTES = _MANIFEST.size


def transfer_key(transfer_id: str) -> int:
    digest = hashlib.blake2b(transfer_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - KEY_BITS)


def message_tag(transfer_id: str, seq: int, index: int) -> int:
    """Tag of data message `index` (0-based) of piece `seq`; ValueError outside the layout."""
    if not 0 <= seq <= MAX_SEQ:
        raise ValueError(f"seq {seq} outside 0..{MAX_SEQ}")
    if not 0 <= index <= MANIFEST_INDEX:
        raise ValueError(f"a piece holds at most {MAX_MESSAGES} messages")
    return (transfer_key(transfer_id) << (SEQ_BITS + INDEX_BITS)) | (seq << INDEX_BITS) | index


def manifest_tag(transfer_id: str, seq: int) -> int:
    return message_tag(transfer_id, seq, MANIFEST_INDEX)


def check_message_count(count: int) -> None:
    if count > MAX_MESSAGES:
        raise ValueError(f"{count} messages in one piece; at most {MAX_MESSAGES} (raise max_message_bytes)")


def encode_manifest(nbytes: int, digest: bytes) -> bytes:
    return _MANIFEST.pack(_MAGIC, nbytes, digest)


class TransferKeys:
    """Live transfer ids by key on one receiver: refuses a second id with the same key."""

    def __init__(self) -> None:
        self._live: dict[int, str] = {}
        self._pieces: dict[str, int] = {}

    def acquire(self, transfer_id: str) -> bool:
        key = transfer_key(transfer_id)
        if self._live.setdefault(key, transfer_id) != transfer_id:
            return False
        self._pieces[transfer_id] = self._pieces.get(transfer_id, 0) + 1
        return True

    def release(self, transfer_id: str) -> None:
        left = self._pieces.get(transfer_id, 0) - 1
        if left > 0:
            self._pieces[transfer_id] = left
            return
        self._pieces.pop(transfer_id, None)
        self._live.pop(transfer_key(transfer_id), None)
