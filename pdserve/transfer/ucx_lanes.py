"""UCX lanes: which side copies a message, the address that names every lane, and the split.

Between two processes on one host UCX moves a large message by rendezvous, and one of the two
processes does the copy (CMA; on GPUs the copy engine). A lane is one UCX worker whose
rendezvous scheme fixes who that is:

    pull   the receiver copies (get_zcopy)     prefill ---RTS--> decode: decode reads prefill
    push   the sender copies (put_zcopy)       prefill <--RTR--- decode: prefill writes decode

With both lanes a piece's messages are split between them, so the two processes copy at the
same time on two cores: a CPU host's memory bandwidth is not reached by one core's copy
(here, 5 GB/s for one thread against 10 GB/s for two).

The receiver decides its lanes; its address carries one UCX worker address per lane, and the
sender connects each with its own worker of the same kind. Which message takes which lane is a
pure function of the piece's messages and the lane count, so both sides derive the same split.
Nothing here imports UCX.
"""

from __future__ import annotations

import struct
from typing import Sequence

from pdserve.transfer.descriptors import BlockRun

LANE_SCHEMES = {"pull": "get_zcopy", "push": "put_zcopy"}
LANE_KINDS = tuple(LANE_SCHEMES)

_MAGIC = b"PDUCXL1"
_HEADER = struct.Struct("<7sB")
_ENTRY = struct.Struct("<BI")


def check_lanes(lanes: Sequence[str]) -> tuple[str, ...]:
    """The lanes as a tuple; ValueError when empty, repeated or of an unknown kind."""
    lanes = tuple(lanes)
    unknown = [lane for lane in lanes if lane not in LANE_SCHEMES]
    if not lanes or unknown or len(set(lanes)) != len(lanes):
        raise ValueError(f"UCX lanes must be distinct kinds among {LANE_KINDS}, got {lanes}")
    return lanes


def encode_address(lanes: Sequence[tuple[str, bytes]]) -> bytes:
    """One blob naming every lane: (kind, UCX worker address) in lane order."""
    parts = [_HEADER.pack(_MAGIC, len(lanes))]
    for kind, address in lanes:
        parts.append(_ENTRY.pack(LANE_KINDS.index(kind), len(address)) + address)
    return b"".join(parts)


def decode_address(blob: bytes) -> tuple[tuple[str, bytes], ...]:
    """Inverse of encode_address; ValueError on anything else."""
    if len(blob) < _HEADER.size or blob[: len(_MAGIC)] != _MAGIC:
        raise ValueError("not a pdserve UCX address")
    _, count = _HEADER.unpack_from(blob)
    offset, lanes = _HEADER.size, []
    for _ in range(count):
        if offset + _ENTRY.size > len(blob):
            raise ValueError("truncated UCX address")
        kind, size = _ENTRY.unpack_from(blob, offset)
        offset += _ENTRY.size
        if kind >= len(LANE_KINDS) or offset + size > len(blob):
            raise ValueError("malformed UCX address")
        lanes.append((LANE_KINDS[kind], blob[offset : offset + size]))
        offset += size
    if offset != len(blob) or not lanes:
        raise ValueError("malformed UCX address")
    return tuple(lanes)


def assign_lanes(messages: Sequence[BlockRun], lanes: int) -> tuple[int, ...]:
    """The lane of every message: each goes to the lane with the fewest blocks so far (lowest on ties)."""
    if lanes < 1:
        raise ValueError("at least one lane")
    load = [0] * lanes
    chosen = []
    for message in messages:
        lane = min(range(lanes), key=lambda i: (load[i], i))
        load[lane] += message.count
        chosen.append(lane)
    return tuple(chosen)
