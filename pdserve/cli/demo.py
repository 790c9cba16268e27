"""The `make run` demo: a few streaming chats of mixed priority beside one long document."""

from __future__ import annotations

import concurrent.futures
import statistics

import grpc

from pdserve.cli.client import stream
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

CHATS = [
    ("vip", "What is the capital of France?"),
    ("normal", "Give me three tips for writing clear code."),
    ("normal", "What is a prime number? Answer briefly."),
    ("vip", "Name two planets of the solar system."),
]
DOCUMENT = ("Summarise the following notes in two sentences.\n\n" +
            " ".join(f"Note {i}: the service splits prefill from decode so that long prompts do not stall "
                     f"streaming chats, and it moves KV cache blocks between workers." for i in range(60)))


def _request(priority: str, text: str, max_tokens: int) -> pb.GenerateRequest:
    request = pb.GenerateRequest(sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
                                 priority={"vip": pb.PRIORITY_VIP, "normal": pb.PRIORITY_NORMAL,
                                           "batch": pb.PRIORITY_BATCH}[priority])
    request.messages.messages.add(role="user", content=text)
    return request


def run_demo(target: str) -> None:
    jobs = [("batch", DOCUMENT, 48)] + [(p, t, 48) for p, t in CHATS]
    with grpc.insecure_channel(target) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda j: stream(stub, _request(*j)), jobs))
    print(f"\n{'priority':8} {'prompt':>7} {'tokens':>6} {'TTFT ms':>8} {'TBT p50':>8} {'TBT max':>8}  answer")
    for (priority, text, _), r in zip(jobs, results):
        p50 = statistics.median(r.gaps_s) * 1e3 if r.gaps_s else 0.0
        worst = max(r.gaps_s) * 1e3 if r.gaps_s else 0.0
        answer = r.text.strip().replace("\n", " ")
        print(f"{priority:8} {r.usage.prompt_tokens:7d} {len(r.token_ids):6d} {r.ttft_s * 1e3:8.0f} {p50:8.0f} "
              f"{worst:8.0f}  {answer[:70]}")
