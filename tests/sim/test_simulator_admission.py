"""The router's admission in the simulator (pdserve/sim/admitting.py): the same policy judges each
request once, from the simulated instances' figures. Verdicts are forced by construction; every
run checks the schedulers' integrity after every step."""

from pdserve.admission import AdmissionPolicy, parse_objectives
from pdserve.requests import Priority
from pdserve.sim import get_hardware, get_shape
from pdserve.sim.deployment import Disaggregated, SimConfig
from pdserve.sim.simulator import simulate
from pdserve.sim.workloads import RequestSpec, Workload

H100 = get_hardware("h100-sxm")
LLAMA8B = get_shape("llama-3.1-8b")
COARSE = 256  # tokens per KV block: cheap integrity checks


def _cfg(ttft: str = "", tbt: str = "", defer_max_s: float = 60.0) -> SimConfig:
    policy = AdmissionPolicy(parse_objectives(ttft, tbt), defer_max_s) if ttft or tbt else None
    return SimConfig(H100, LLAMA8B, block_size=COARSE, admission=policy)


def _workload(*specs: RequestSpec) -> Workload:
    return Workload("test", tuple(sorted(specs, key=lambda r: r.arrival_s)), "test")


def _run(workload: Workload, cfg: SimConfig):
    return simulate(workload, Disaggregated(1, 1, 1, 1), cfg, check_integrity=True)


def test_a_chat_behind_a_document_is_prefilled_by_its_decode_instance():
    # A 64K document holds the prefill instance for seconds; the chat's objective is 1 s and the
    # decode instance is idle: only its own prefill is within.
    workload = _workload(RequestSpec("doc", 0.0, 65_536, 8, Priority.BATCH, "document"),
                         RequestSpec("chat", 0.5, 512, 16, Priority.NORMAL, "chat"))
    result = _run(workload, _cfg(ttft="normal=1"))
    assert dict(result.admissions) == {"admit/no_objective": 1, "local/local_within": 1}
    chat, doc = (next(t for t in result.traces if t.spec.request_id == rid) for rid in ("chat", "doc"))
    assert chat.ttft_s < 1.0 and chat.ttft_s < doc.ttft_s
    assert all(len(t.token_times) == t.spec.output_tokens for t in result.traces)
    assert result.kv_transferred_bytes == 65_536 * LLAMA8B.kv_bytes_per_token()  # the chat's KV never crossed


def test_under_overload_chats_are_refused_and_documents_deferred_never_lost():
    # Forty 16K chats in 0.4 s are seconds of prefill queue on either instance: with a 1 s objective
    # later chats are refused; documents are deferred, then run once deferred for 2 s.
    chats = [RequestSpec(f"chat-{i}", 0.01 * i, 16_384, 8, Priority(i % 2), "chat") for i in range(40)]
    docs = [RequestSpec(f"doc-{i}", 0.2 + 0.01 * i, 16_384, 8, Priority.BATCH, "document") for i in range(4)]
    result = _run(_workload(*chats, *docs), _cfg(ttft="vip=1,normal=1,batch=1", defer_max_s=2.0))
    verdicts = dict(result.admissions)
    assert verdicts.get("refuse/ttft", 0) > 0 and verdicts.get("defer/ttft", 0) > 0
    for trace in result.traces:
        if trace.failure is not None:
            assert trace.failure.startswith("refused (ttft)") and trace.spec.priority != Priority.BATCH
            assert trace.token_times == []
        else:
            assert len(trace.token_times) == trace.spec.output_tokens
    assert all(t.failure is None for t in result.traces if t.spec.priority == Priority.BATCH)


def test_objectives_every_path_meets_change_nothing():
    chats = [RequestSpec(f"chat-{i}", 0.05 * i, 2048, 32, Priority(i % 2), "chat") for i in range(20)]
    workload = _workload(*chats)
    judged = _run(workload, _cfg(ttft="vip=1000,normal=1000"))
    plain = _run(workload, _cfg())
    assert dict(judged.admissions) == {"admit/within": 20} and plain.admissions == ()
    assert [t.token_times for t in judged.traces] == [t.token_times for t in plain.traces]
