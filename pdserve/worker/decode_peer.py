"""A sender's side of a decode worker's reservation on the wire: the reservation as a `Target`,
and the calls that fill it (PushKV, CompleteKV) through the decode worker's gRPC service."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from pdserve.kv.page_groups import pages_from_wire, pages_to_wire
from pdserve.errors import CorruptKV, IncompatibleError, InvalidRequestError, PeerFault
from pdserve.rpc.bounds import check_address, check_id, check_kv_address
from pdserve.rpc.channels import ChannelPool
from pdserve.rpc.kv_ranks import kv_ranks_from_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from pdserve.worker.kv_out import DecodePeer, Piece, Target


def target_from_pb(t: wpb.KVReservation, transport: str, identity: str) -> Target:
    """The reservation's addresses, transport and identity checked here (`transport`: the only
    kind this worker's sender can fill; `identity`: this worker's digest, which the decode
    worker's must equal: else IncompatibleError, and nothing is sent); its layout by the sender
    (pdserve/worker/kv_out.py)."""
    if t.identity != identity:
        raise IncompatibleError(f"reservation of decode worker {t.decode_endpoint[:64]!r} for KV of another model or "
                                f"layout (identity {t.identity[:16]!r}, here {identity!r}): refused, nothing sent")
    if t.transport != transport:
        raise InvalidRequestError(f"reservation over transport {t.transport[:32]!r}; this worker sends over "
                                  f"{transport!r}")
    return Target(check_id("transfer_id", t.transfer_id), check_kv_address(t.kv_address), pages_from_wire(t.block_ids),
                  t.block_size, t.block_nbytes, check_address("decode_endpoint", t.decode_endpoint),
                  t.kv_secret, t.num_blocks, t.cached_blocks, kv_ranks_from_pb(t.ranks))


class GrpcDecodePeer(DecodePeer):
    def __init__(self, channels: ChannelPool):
        self.channels = channels

    def _stub(self, endpoint: str) -> worker_pb2_grpc.DecodeWorkerStub:
        return worker_pb2_grpc.DecodeWorkerStub(self.channels.get(endpoint))

    async def push_kv(self, endpoint: str, piece: Piece) -> None:
        message = wpb.KVPiece(transfer_id=piece.transfer_id, seq=piece.seq, block_index=piece.block_index,
                              src_block_ids=pages_to_wire(piece.src_block_ids), timeout_s=piece.timeout_s,
                              kv_secret=piece.secret, tensor_parallel_size=piece.senders if piece.senders > 1 else 0,
                              kv_addresses=list(piece.addresses))
        try:
            await self._stub(endpoint).PushKV(message, timeout=piece.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _peer_fault("PushKV", endpoint, exc) from None

    async def complete_kv(self, endpoint: str, transfer_id: str, num_pieces: int, first_token: int,
                          secret: bytes, checksums: Sequence[int] = ()) -> None:
        message = wpb.KVComplete(transfer_id=transfer_id, num_pieces=num_pieces, first_token_id=first_token,
                                 kv_secret=secret, piece_checksums=list(checksums))
        try:
            await self._stub(endpoint).CompleteKV(message, timeout=60.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DATA_LOSS:  # what this worker sent arrived other than it summed it
                raise CorruptKV(f"CompleteKV on decode worker {endpoint}: {exc.details() or ''}") from None
            raise _peer_fault("CompleteKV", endpoint, exc) from None


def _peer_fault(method: str, endpoint: str, exc: grpc.aio.AioRpcError) -> PeerFault:
    return PeerFault(f"{method} on decode worker {endpoint}: {exc.code().name}: {exc.details() or ''}")
