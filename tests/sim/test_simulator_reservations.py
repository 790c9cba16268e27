"""When a split reserves a prompt's decode blocks (SimConfig.reserve_at): on arrival, as the
service does, documents queued behind one prefill instance hold the decode pool and the chats
behind them wait for blocks; when their prefill starts (the what-if), only the prompts being
computed hold blocks. Simulated time, so every figure is the same in every run; every run checks
the schedulers' integrity after every step."""

import pytest

from pdserve.elastic import RoleChange
from pdserve.requests import Priority
from pdserve.scheduler import QueueFullError
from pdserve.sim import get_hardware, get_shape
from pdserve.sim.deployment import Disaggregated, SimConfig
from pdserve.sim.disagg import DisaggregatedFlow
from pdserve.sim.events import EventLoop
from pdserve.sim.metrics import summarize
from pdserve.sim.recorder import Recorder
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import RequestSpec, Workload, make_request

H100 = get_hardware("h100-sxm")
LLAMA8B = get_shape("llama-3.1-8b")
COARSE = 256  # tokens per KV block: few blocks, so checking every block after every step stays cheap
DOC_TOKENS = 146 * COARSE  # two documents' blocks leave the decode pool less than a chat's beside its watermark


def _workload(*specs: RequestSpec) -> Workload:
    return Workload("test", tuple(sorted(specs, key=lambda r: r.arrival_s)), "test")


def _documents_then_chats() -> Workload:
    docs = [RequestSpec(f"doc-{i}", 0.01 * i, DOC_TOKENS, 16, Priority.BATCH, "document") for i in range(8)]
    chats = [RequestSpec(f"chat-{i}", 0.5 + 0.01 * i, 300, 64, Priority.NORMAL, "chat") for i in range(8)]
    return _workload(*docs, *chats)


def _config(reserve_at: str) -> SimConfig:
    # a decode pool of 308 blocks, 15 of them its watermark: 308 - 2 x 146 = 16 < 2 + 15 (a chat's 300
    # tokens are two blocks)
    return SimConfig(H100, LLAMA8B, memory_fraction=0.33, block_size=COARSE, reserve_at=reserve_at)


def _chat_ttfts(result) -> list[float]:
    return [t.ttft_s for t in result.traces if t.spec.kind == "chat"]


def test_reserving_when_the_prefill_starts_keeps_the_decode_pool_for_prompts_being_computed():
    workload, split = _documents_then_chats(), Disaggregated(1, 1, 1, 1)
    early = simulate(workload, split, _config("arrival"), check_integrity=True)
    late = simulate(workload, split, _config("prefill"), check_integrity=True)
    for result in (early, late):
        summary = summarize(result)
        assert summary.failed == 0 and summary.unfinished == 0
        assert all(len(t.token_times) == t.spec.output_tokens for t in result.traces)
    first_document_s = min(t.ttft_s for t in early.traces if t.spec.kind == "document")
    # On arrival the first two documents' reservations fill the pool: the chats, arriving half a
    # second later, wait there for blocks most of the time the documents take to prefill.
    assert min(_chat_ttfts(early)) > 0.5 * first_document_s
    # Reserved when their prefill starts, the documents leave the chats room: each chat's blocks
    # are there when its own prefill starts, beside the documents' chunks.
    assert max(_chat_ttfts(late)) < 0.1 * first_document_s


def test_a_late_reservation_refused_ends_its_prefill_and_nothing_else():
    workload, cfg = _documents_then_chats(), _config("prefill")
    loop, recorder = EventLoop(), Recorder(workload, False)
    flow = DisaggregatedFlow(Disaggregated(1, 1, 1, 1), cfg, loop, recorder, check_integrity=True)
    decode = flow.decode[0]
    add_remote = decode.scheduler.add_remote

    def refuse_one(request, *args):
        if request.request_id == "doc-1":
            raise QueueFullError("the decode worker's queue is full (forced)")
        return add_remote(request, *args)

    decode.scheduler.add_remote = refuse_one
    for index, spec in enumerate(workload.requests):
        loop.at(spec.arrival_s, lambda r=make_request(spec, index): flow.arrive(r))
    loop.run()
    failed = {rid: t.failure for rid, t in recorder.requests.items() if t.failure}
    assert list(failed) == ["doc-1"] and "forced" in failed["doc-1"]
    for rid, trace in recorder.requests.items():
        assert rid == "doc-1" or len(trace.token_times) == trace.spec.output_tokens
    for instance in flow.instances:  # every block back, on both sides
        stats = instance.scheduler.stats()
        assert not (stats.running or stats.waiting or stats.swapped or stats.receiving)
        assert instance.scheduler.kv.num_available == instance.kv_blocks


def test_reserve_at_is_arrival_or_prefill():
    assert SimConfig(H100, LLAMA8B).reserve_at == "arrival"  # as the service does
    with pytest.raises(ValueError, match="reserve_at 'later'"):
        SimConfig(H100, LLAMA8B, reserve_at="later")


def test_a_decode_instance_leaving_before_a_late_reservation_sends_it_to_another():
    """A document's prefill has begun and asked decode-0 for blocks, which wait there for a long
    chat to end, when decode-0 begins to change role: the chat moves with its KV, the document asks
    decode-1 instead, its prefill going on, and is served there once its chat ends too."""
    chats = [RequestSpec(f"chat-{i}", 0.0, 256, 2048, Priority.NORMAL, "chat") for i in range(2)]
    # 117 blocks a decode pool, 5 its watermark beside a running chat: 113 do not fit beside one
    doc = RequestSpec("doc", 0.5, 113 * COARSE, 16, Priority.NORMAL, "document")
    workload = _workload(*chats, doc)
    loop, recorder = EventLoop(), Recorder(workload, False)
    cfg = SimConfig(H100, LLAMA8B, memory_fraction=0.25, block_size=COARSE, reserve_at="prefill")
    flow = DisaggregatedFlow(Disaggregated(1, 1, 2, 1, elastic=True), cfg, loop, recorder, check_integrity=True)
    asked: list[str] = []

    def leave_once_asked() -> None:  # every simulated millisecond until the blocks are asked for
        decode = next((d for d in flow.decode if d.scheduler.get("doc") is not None), None)
        if decode is None:
            loop.at(loop.now + 0.001, leave_once_asked)
            return
        assert decode.scheduler.stats().waiting == 1  # asked for, waiting for room
        asked.append(decode.name)
        flow.change_role(RoleChange(decode.name, "decode", "prefill", "test", {}))

    for index, spec in enumerate(workload.requests):
        loop.at(spec.arrival_s, lambda r=make_request(spec, index): flow.arrive(r))
    loop.at(0.5, leave_once_asked)
    loop.run()
    for trace in recorder.requests.values():
        assert trace.failure is None and len(trace.token_times) == trace.spec.output_tokens
    assert asked and any(f"done: {asked[0]} serves as prefill" in c for c in recorder.role_changes)
