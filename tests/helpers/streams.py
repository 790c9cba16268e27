"""A raw gRPC stream of Generate, timed: what the end-to-end tests read (they speak the wire
directly; users call pdserve through pdserve.client)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc


@dataclass
class StreamResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    usage: pb.Usage | None = None
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)


def stream(stub: generation_pb2_grpc.GenerationStub, request: pb.GenerateRequest, echo: bool = False,
           timeout: float | None = None) -> StreamResult:
    """`echo`: write the text to stdout as it comes."""
    result = StreamResult()
    start = last = time.perf_counter()
    for message in stub.Generate(request, timeout=timeout):
        now = time.perf_counter()
        if message.token_ids:
            if not result.token_ids:
                result.ttft_s = now - start
            else:
                result.gaps_s.append(now - last)
            last = now
        result.token_ids.extend(message.token_ids)
        result.text += message.text
        if echo:
            sys.stdout.write(message.text)
        if message.finish_reason:
            result.finish_reason = pb.FinishReason.Name(message.finish_reason)
            result.usage = message.usage
    return result
