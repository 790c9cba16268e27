"""Oversized requests are refused on their sizes, before any work, while other streams go on."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        kib = next(line for line in status if line.startswith("VmRSS:")).split()[1]
    return int(kib) * 1024


STREAM_TOKENS = 60


def _a_stream(target: str, out: dict) -> None:
    """Runs a stream to its end: its tokens and finish reason, and the largest gap between its
    messages (printed, not asserted: how long a stream waits is a speed, for the benchmarks)."""
    with grpc.insecure_channel(target) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        request = pb.GenerateRequest(text="Count from one to one hundred:", sampling=pb.SamplingParams(
            max_tokens=STREAM_TOKENS, temperature=0, ignore_eos=True))
        last, gaps, tokens = None, [0.0], 0
        for response in stub.Generate(request, timeout=120):
            now = time.monotonic()
            if last is not None:
                gaps.append(now - last)
            last = now
            tokens += len(response.token_ids)
            out["finish_reason"] = response.finish_reason
            out.setdefault("first", now)
        out["tokens"], out["max_gap"] = tokens, max(gaps)


@pytest.mark.parametrize("request_", [
    pb.GenerateRequest(text="x" * 60_000_000),
    pb.GenerateRequest(token_ids=pb.TokenIds(ids=[7] * 8_000_000)),
], ids=["60-MB-text", "8M-token-ids"])
def test_a_huge_prompt_is_refused_on_its_size_while_another_stream_runs_to_its_end(service, request_):
    """Sent while another stream is in flight: refused INVALID_ARGUMENT by the size limit (its
    flag named, so it was never tokenised), and the other stream is served in full."""
    stream: dict = {}
    runner = threading.Thread(target=_a_stream, args=(service["target"], stream))
    runner.start()
    deadline = time.monotonic() + 120
    while "first" not in stream and time.monotonic() < deadline:
        time.sleep(0.05)
    with grpc.insecure_channel(service["target"], options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            list(generation_pb2_grpc.GenerationStub(channel).Generate(request_, timeout=60))
        refused_s = time.monotonic() - started
    runner.join(120)
    print(f"refused in {refused_s:.2f} s; the concurrent stream's largest gap {stream.get('max_gap', 0):.2f} s")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "--max-prompt" in err.value.details()
    assert "first" in stream, "the other stream never started"
    assert (stream["tokens"], stream["finish_reason"]) == (STREAM_TOKENS, pb.FINISH_REASON_LENGTH)


@pytest.mark.parametrize("request_", [
    pb.GenerateRequest(text="x" * 60_000_000),
    pb.GenerateRequest(token_ids=pb.TokenIds(ids=[7] * 8_000_000)),
], ids=["60-MB-text", "8M-token-ids"])
def test_refused_huge_prompts_leave_nothing_behind_in_the_router(service, request_):
    """A refusal that kept its request would hold at least the parsed message (its text's bytes,
    or four bytes per token id), so the RSS would climb by that much at every refusal, twelve
    messages over the last twelve of sixteen. The allocator's high-water marks also wander (jumps
    and creeps of tens of MB while its arenas settle, some given back), so the bound is half that."""
    kept = max(request_.ByteSize(), 4 * len(request_.token_ids.ids))
    pid, sizes = service["router"].pid, []
    with grpc.insecure_channel(service["target"], options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        for _ in range(16):
            with pytest.raises(grpc.RpcError) as err:
                list(generation_pb2_grpc.GenerationStub(channel).Generate(request_, timeout=60))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            sizes.append(_rss_bytes(pid))
    print(f"router RSS after each refusal of a {request_.ByteSize() / 1e6:.1f} MB request: "
          f"{[round(s / 1e6) for s in sizes]} MB")
    assert max(sizes[4:]) - sizes[3] < 12 * kept / 2
