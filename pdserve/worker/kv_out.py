"""KV a worker sends into a decode worker's reservation: a prefill worker's prompt, or a leaving
decode worker's running request (a move). Both go the same way:

    decode.PushKV(piece: which blocks go where)  then  sender.send(blocks)    (per piece, in order;
                                                 each summed meanwhile, pdserve/worker/kv_sums.py)
    decode.CompleteKV(the token the decode worker feeds first, every piece's sum)

`Target` is the reservation as the sender sees it, `check_target` what it must hold before a
byte is sent, `send_piece` one piece's announcement and data.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.errors import InvalidRequestError, PeerFault
from pdserve.kv.page_groups import NULL_PAGE, live_pairs
from pdserve.parallel.kv_ranks import RankEnd, RanksSender, check_ends
from pdserve.transfer import TransferError, TransferResult
from pdserve.transfer.checksum import NONE
from pdserve.transfer.wire import check_secret
from pdserve.worker.kv_sums import KVSums


@dataclass(frozen=True)
class Target:
    """The decode worker's reservation for this request; `secret` is its, presented on every
    call and keying the KV data; `num_blocks` is the decode pool's size."""

    transfer_id: str
    kv_address: bytes
    block_ids: tuple[int, ...]
    block_size: int
    block_nbytes: int
    decode_endpoint: str
    secret: bytes = field(repr=False)
    num_blocks: int
    cached_blocks: int = 0  # leading blocks the decode worker holds already: never sent
    ranks: tuple[RankEnd, ...] = ()  # the decode ranks (tensor parallel); none: one, every head at kv_address


@dataclass(frozen=True)
class Piece:
    transfer_id: str
    seq: int
    block_index: int
    src_block_ids: tuple[int, ...]
    timeout_s: float
    secret: bytes = field(repr=False)
    senders: int = 1  # the sending worker's tensor parallel size: each rank sends its share of the heads
    addresses: tuple[bytes, ...] = ()  # the receivers it goes to: the decode worker confirms them first


@dataclass(frozen=True)
class Sent:
    """What one piece cost: bytes over the transport, descriptors (runs), seconds announce to landed."""

    nbytes: int
    descriptors: int
    seconds: float
    checksum: int = NONE  # the piece's sum as sent (NONE: not summed)


class DecodePeer(abc.ABC):
    """The control-plane calls a sender makes on a decode worker (the wire side implements it).
    Either call raises PeerFault when the decode worker fails or refuses it."""

    @abc.abstractmethod
    async def push_kv(self, endpoint: str, piece: Piece) -> None:
        """Announce a piece: the decode worker posts receives for exactly its blocks."""

    @abc.abstractmethod
    async def complete_kv(self, endpoint: str, transfer_id: str, num_pieces: int, first_token: int,
                          secret: bytes, checksums: Sequence[int] = ()) -> None:
        """Every piece was sent; the decode worker starts decoding after the first token, once
        each piece's blocks sum to its `checksums` entry (empty: unchecked). CorruptKV when
        they do not."""


def check_target(target: Target, sender: RanksSender, block_size: int, block_nbytes: int, kv_tokens: int,
                 groups: int = 1) -> None:
    """InvalidRequestError unless `sender` (blocks of `block_size` tokens, `block_nbytes` per rank,
    pages of `groups` layer groups) can fill `target` with the KV of `kv_tokens` tokens: its
    secret, layout and block ids (a table entry per block and group: pdserve/kv/page_groups.py)."""
    try:
        check_secret(target.secret)
    except ValueError as exc:
        raise InvalidRequestError(f"kv_secret: {exc}") from None
    ends = sender.ends_of(target.ranks, target.kv_address)
    try:
        check_ends(ends, sender.num_heads)
    except ValueError as exc:
        raise InvalidRequestError(f"KV layout mismatch: {exc}") from None
    per_head = target.block_nbytes * sender.heads_per_rank, block_nbytes * ends[0].heads.count
    if target.block_size != block_size or per_head[0] != per_head[1]:
        raise InvalidRequestError(
            f"KV layout mismatch: decode blocks are {target.block_size} tokens / {target.block_nbytes} bytes, "
            f"here {block_size} / {block_nbytes} (same model and block size needed)")
    _check_blocks(target, groups * -(-kv_tokens // block_size), groups)


def _check_blocks(target: Target, needed: int, groups: int) -> None:
    """One distinct decode block per block (and layer group) of the KV, each inside the pool it
    states, unless the decode worker needs none there (NULL_PAGE), and at least the last one to send."""
    ids = target.block_ids
    if len(ids) != needed:
        raise InvalidRequestError(f"reservation of {len(ids)} blocks for KV of {needed} blocks")
    if not 0 <= target.cached_blocks * groups < len(ids):
        raise InvalidRequestError(f"cached_blocks {target.cached_blocks} of a {len(ids)}-block reservation: the "
                                  "last block is always sent")
    live = [b for b in ids if b != NULL_PAGE]
    if len(set(live)) != len(live) or any(not 0 <= b < target.num_blocks for b in live) or ids[-1] == NULL_PAGE:
        raise InvalidRequestError(f"reservation block ids repeated or outside the decode pool of "
                                  f"{target.num_blocks} blocks")


async def send_piece(sender: RanksSender, peer: DecodePeer, target: Target, piece: Piece,
                     sums: KVSums | None = None) -> Sent:
    """Announce `piece` to the decode worker, then send its blocks into the reservation's blocks
    from `piece.block_index` on, summed meanwhile when `sums` is given. PeerFault when the decode
    worker or the send fails."""
    started = time.perf_counter()
    ends = sender.ends_of(target.ranks, target.kv_address)
    # The decode worker confirms these are its receivers before any byte goes (a damaged address
    # could crash the transport's native code).
    await peer.push_kv(target.decode_endpoint, dataclasses.replace(piece, addresses=tuple(e.address for e in ends)))
    try:
        pairs = live_pairs(piece.src_block_ids, target.block_ids[piece.block_index:])
    except ValueError as exc:
        raise InvalidRequestError(f"KV of {piece.transfer_id}: {exc}") from None

    async def send() -> TransferResult:
        try:
            return await sender.send(ends, piece.transfer_id, piece.seq, pairs, piece.timeout_s, secret=piece.secret)
        except TransferError as exc:
            raise PeerFault(f"KV send to {target.decode_endpoint} failed: {exc}") from exc

    sent = [src for src, _ in pairs]
    result, checksum = await sums.send(sent, send) if sums is not None else (await send(), NONE)
    return Sent(result.nbytes, len(result.runs), time.perf_counter() - started, checksum)
