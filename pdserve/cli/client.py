"""A streaming gRPC client of the public API (used by `pdserve generate --target` and the demo)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import grpc

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

PRIORITIES = {"vip": pb.PRIORITY_VIP, "normal": pb.PRIORITY_NORMAL, "batch": pb.PRIORITY_BATCH}


@dataclass
class StreamResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    usage: pb.Usage | None = None
    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)


def build_request(prompt: str, args: argparse.Namespace) -> pb.GenerateRequest:
    sampling = pb.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                 top_k=args.top_k, min_p=args.min_p, stop=args.stop, ignore_eos=args.ignore_eos)
    if args.seed is not None:
        sampling.seed = args.seed
    request = pb.GenerateRequest(sampling=sampling, priority=PRIORITIES[args.priority])
    if args.raw:
        request.text = prompt
    else:
        request.messages.messages.add(role="user", content=prompt)
    return request


def stream(stub: generation_pb2_grpc.GenerationStub, request: pb.GenerateRequest, echo: bool = False,
           timeout: float | None = None) -> StreamResult:
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
            sys.stdout.flush()
        if message.finish_reason:
            result.finish_reason = pb.FinishReason.Name(message.finish_reason)
            result.usage = message.usage
    return result


def stream_remote(args: argparse.Namespace) -> int:
    with grpc.insecure_channel(args.target) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        try:
            result = stream(stub, build_request(args.prompt, args), echo=True)
        except grpc.RpcError as exc:
            print(f"\nerror: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    gaps = sorted(result.gaps_s)
    p50 = gaps[len(gaps) // 2] * 1e3 if gaps else 0.0
    worst = gaps[-1] * 1e3 if gaps else 0.0
    print(f"\n[finish={result.finish_reason} tokens={len(result.token_ids)} TTFT={result.ttft_s * 1e3:.1f} ms "
          f"TBT p50={p50:.1f} ms max={worst:.1f} ms usage={{{str(result.usage).strip().replace(chr(10), ', ')}}}]",
          file=sys.stderr)
    return 0
