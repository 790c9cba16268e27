"""An in-process Generation service that answers by the prompt's text, for the client's tests.

    "count": max_tokens messages of one token each (token i is i), then LENGTH with usage; a
             continued stream (resume_from_token) from there on
    "hold": one token, then holds the call open until the client ends it
    "bad": INVALID_ARGUMENT
A router made with `dies_after=k` ends every stream UNAVAILABLE after its k-th token, as a router
that died would.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

HOLD_S = 30.0  # how long "hold" keeps a call open at most


@dataclass
class Seen:
    """What the service saw of one call."""

    request: pb.GenerateRequest
    metadata: dict[str, str]
    ended: threading.Event = field(default_factory=threading.Event)


class FakeGeneration(generation_pb2_grpc.GenerationServicer):
    def __init__(self, dies_after: int | None = None) -> None:
        self.calls: list[Seen] = []
        self.arrived = threading.Event()
        self.dies_after = dies_after

    def Generate(self, request, context):
        seen = Seen(request, dict(context.invocation_metadata()))
        context.add_callback(seen.ended.set)
        self.calls.append(seen)
        self.arrived.set()
        if request.text == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a bad prompt")
        if request.text == "hold":
            yield pb.GenerateResponse(request_id=request.request_id, token_ids=[1], text="a")
            seen.ended.wait(HOLD_S)
            return
        for i in range(request.resume_from_token, request.sampling.max_tokens):
            if i == self.dies_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            yield pb.GenerateResponse(request_id=request.request_id, token_ids=[i], text=f"{i} ")
        yield pb.GenerateResponse(request_id=request.request_id, finish_reason=pb.FINISH_REASON_LENGTH,
                                  usage=pb.Usage(prompt_tokens=1, completion_tokens=request.sampling.max_tokens))

    def Abort(self, request, context):
        return pb.AbortResponse(found=request.request_id == "running")


class FakeRouter:
    """The service on a free loopback port, for a `with` block."""

    def __init__(self, dies_after: int | None = None) -> None:
        self.service = FakeGeneration(dies_after)
        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        generation_pb2_grpc.add_GenerationServicer_to_server(self.service, self._server)
        self.target = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"

    def __enter__(self) -> FakeRouter:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None)

    def last_call(self) -> Seen:
        assert self.service.arrived.wait(10), "no call reached the service"
        return self.service.calls[-1]
