"""Every RPC the fuzz tests send, with a valid message of each to mutate.

Messages that name a KV transfer (Prefill, SetTarget, PushKV, CompleteKV) are valid only against a live
reservation: `reservation()` opens a Decode stream for it and cancels the stream afterwards, so
the decode worker frees its blocks whatever the fuzzed call did.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import worker_pb2 as wpb
from tests.fuzz.calls import GENEROUS_DEADLINE_S

GENERATE = "/pdserve.v1.Generation/Generate"
PUSH, COMPLETE = "/pdserve.v1.DecodeWorker/PushKV", "/pdserve.v1.DecodeWorker/CompleteKV"
PROMPT = (504, 2988, 314, 4649, 314, 260, 1345, 2003, 30, 198, 7042, 30, 198, 504, 2988, 314, 42, 216, 33, 34)
GREEDY = pb.SamplingParams(max_tokens=4, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0)


@dataclass
class Ids:
    """Fresh request ids, so that no example meets an earlier one's request, nor one of an earlier
    test on the same fleet that is still ending there (each Ids draws its own prefix)."""

    counter: Iterator[int] = field(default_factory=itertools.count)
    prefix: str = field(default_factory=lambda: secrets.token_hex(3))

    def next(self, kind: str) -> str:
        return f"fuzz-{kind}-{self.prefix}-{next(self.counter):06d}"


@dataclass(frozen=True)
class Rpc:
    """One RPC; `valid` builds a valid request from fresh ids and, if it needs one, a reservation."""

    role: str  # where it is served: router (public port), registry (its internal port), prefill or decode
    method: str
    request: type[Message]
    valid: Callable[[Ids, Reserved | None], Message]
    stream: bool = False
    may_wait: bool = False  # may rightly outlast the caller's deadline
    needs_reservation: bool = False
    max_responses: int = 4
    deadline_s: float = GENEROUS_DEADLINE_S
    variant: str = ""  # which of several valid messages of one method

    @property
    def name(self) -> str:
        service_method = self.method.rsplit(".", 1)[-1].replace("/", ".")
        return f"{service_method}.{self.variant}" if self.variant else service_method

    def __repr__(self) -> str:
        return self.name


def _worker_request(ids: Ids, kind: str, kv_timeout_s: float = 5.0) -> wpb.WorkerRequest:
    return wpb.WorkerRequest(request_id=ids.next(kind), prompt_token_ids=PROMPT, sampling=GREEDY,
                             priority=pb.PRIORITY_NORMAL, kv_timeout_s=kv_timeout_s)


def _generate(ids: Ids, _) -> pb.GenerateRequest:
    return pb.GenerateRequest(request_id=ids.next("generate"), token_ids=pb.TokenIds(ids=PROMPT), sampling=GREEDY,
                              priority=pb.PRIORITY_NORMAL)


def _generate_text(ids: Ids, _) -> pb.GenerateRequest:
    return pb.GenerateRequest(request_id=ids.next("generate"), text="<|im_start|>user\nHi<|im_end|>\n",
                              sampling=pb.SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, top_k=20, seed=7,
                                                         stop=["\n\n"], stop_token_ids=[2]))


def _generate_chat(ids: Ids, _) -> pb.GenerateRequest:
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="system", content="Be brief."),
                                     pb.ChatMessage(role="user", content="Name a colour.")])
    return pb.GenerateRequest(request_id=ids.next("generate"), messages=chat, sampling=GREEDY,
                              priority=pb.PRIORITY_BATCH)


def _prefill(ids: Ids, reserved: Reserved | None) -> wpb.PrefillRequest:
    return wpb.PrefillRequest(request=_worker_request(ids, "prefill"), target=reserved.target)


def _set_target(ids: Ids, reserved: Reserved | None) -> wpb.SetTargetRequest:
    return wpb.SetTargetRequest(request_id=ids.next("prefill"), target=reserved.target)


def _decode(ids: Ids, _) -> wpb.DecodeRequest:
    return wpb.DecodeRequest(request=_worker_request(ids, "decode", kv_timeout_s=2.0))


def kv_piece(target: wpb.KVReservation, seq: int) -> wpb.KVPiece:
    """Piece `seq` of a transfer into `target`, one block each (its data never comes)."""
    writable = len(target.block_ids) - target.cached_blocks  # the decode worker's own hits are never written
    return wpb.KVPiece(transfer_id=target.transfer_id, seq=seq, block_index=target.cached_blocks + seq % writable,
                       src_block_ids=[seq], timeout_s=1.0, kv_secret=target.kv_secret)


def kv_complete(target: wpb.KVReservation, pieces: int) -> wpb.KVComplete:
    return wpb.KVComplete(transfer_id=target.transfer_id, num_pieces=pieces, first_token_id=42,
                          kv_secret=target.kv_secret)


def _push(ids: Ids, reserved: Reserved | None) -> wpb.KVPiece:
    return kv_piece(reserved.target, 0)


def _complete(ids: Ids, reserved: Reserved | None) -> wpb.KVComplete:
    return kv_complete(reserved.target, 1)


def _move(ids: Ids, reserved: Reserved | None) -> wpb.MoveKVRequest:
    return wpb.MoveKVRequest(request_id=ids.next("move"), target=reserved.target)


def _abort(ids: Ids, _) -> wpb.WorkerAbortRequest:
    return wpb.WorkerAbortRequest(request_id=ids.next("abort"))


RPCS = (
    Rpc("router", GENERATE, pb.GenerateRequest, _generate, stream=True, variant="token_ids"),
    Rpc("router", GENERATE, pb.GenerateRequest, _generate_text, stream=True, variant="text"),
    Rpc("router", GENERATE, pb.GenerateRequest, _generate_chat, stream=True, variant="messages"),
    Rpc("router", "/pdserve.v1.Generation/Abort", pb.AbortRequest,
        lambda ids, _: pb.AbortRequest(request_id=ids.next("generate"))),
    Rpc("registry", "/pdserve.v1.Registry/Register", wpb.RegisterRequest,
        lambda ids, _: wpb.RegisterRequest(address="127.0.0.1:9", role="decode")),
    Rpc("prefill", "/pdserve.v1.PrefillWorker/Prefill", wpb.PrefillRequest, _prefill, stream=True,
        needs_reservation=True, max_responses=64, may_wait=True, deadline_s=5.0),  # target_follows: waits for it
    Rpc("prefill", "/pdserve.v1.PrefillWorker/SetTarget", wpb.SetTargetRequest, _set_target, needs_reservation=True),
    Rpc("prefill", "/pdserve.v1.PrefillWorker/MatchPrefix", wpb.MatchPrefixRequest,
        lambda ids, _: wpb.MatchPrefixRequest(token_ids=PROMPT)),
    Rpc("prefill", "/pdserve.v1.PrefillWorker/Abort", wpb.WorkerAbortRequest, _abort),
    Rpc("prefill", "/pdserve.v1.PrefillWorker/Stats", wpb.StatsRequest, lambda ids, _: wpb.StatsRequest()),
    Rpc("decode", "/pdserve.v1.DecodeWorker/Decode", wpb.DecodeRequest, _decode, stream=True, may_wait=True,
        max_responses=1, deadline_s=3.0),
    Rpc("decode", PUSH, wpb.KVPiece, _push, needs_reservation=True),
    Rpc("decode", COMPLETE, wpb.KVComplete, _complete, needs_reservation=True),
    Rpc("decode", "/pdserve.v1.DecodeWorker/Depart", wpb.DepartRequest,
        lambda ids, _: wpb.DepartRequest(request_id=ids.next("depart"), keep_kv=True)),
    Rpc("decode", "/pdserve.v1.DecodeWorker/MoveKV", wpb.MoveKVRequest, _move, needs_reservation=True),
    Rpc("decode", "/pdserve.v1.DecodeWorker/Abort", wpb.WorkerAbortRequest, _abort),
    Rpc("decode", "/pdserve.v1.DecodeWorker/Stats", wpb.StatsRequest, lambda ids, _: wpb.StatsRequest()),
)

BY_METHOD = {rpc.method: rpc for rpc in RPCS if not rpc.variant}
METHODS = tuple({rpc.method: rpc for rpc in RPCS}.values())  # one Rpc (any variant) per method


@dataclass(frozen=True)
class Reserved:
    """A Decode stream's request on the decode worker and the blocks it reserved."""

    request_id: str
    target: wpb.KVReservation


@contextmanager
def reservation(channel: grpc.Channel, metadata, ids: Ids) -> Iterator[Reserved]:
    """Blocks reserved on the decode worker for PROMPT, held until the block ends (or until no KV
    came for 3 s after a piece was announced)."""
    decode = channel.unary_stream("/pdserve.v1.DecodeWorker/Decode",
                                  request_serializer=wpb.DecodeRequest.SerializeToString,
                                  response_deserializer=wpb.DecodeEvent.FromString)
    request = _worker_request(ids, "reserve", kv_timeout_s=3.0)
    events = decode(wpb.DecodeRequest(request=request), metadata=metadata, timeout=60)
    try:
        event = next(events)
        assert event.WhichOneof("event") == "reserved", f"the decode worker sent {event} before any reservation"
        yield Reserved(request.request_id, event.reserved)
    finally:
        events.cancel()
