"""An elastic worker changes role under load: it stops taking work of its role, its streams leave
for the other decode worker with their KV (or finish there), it serves the other role, and back;
outputs equal the reference's, nothing is lost, every
worker returns to zero active blocks. A kill and a cancel during a change, too.

Fleet: a prefill worker P, a decode worker D and an elastic worker E (started as decode), one
router listing D and E as decode workers: it learns E's role from E's Stats. They serve a tiny
random model, each step paced to the embedded model's pace here (pdserve/engine/faults.py), so a
stream lasts as long as on the embedded model by construction while the workers spend almost no CPU.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import grpc
import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.client.results import Collector, now
from pdserve.procs.health import wait_serving
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from tests.helpers.cluster import cluster_flags, cluster_metadata
from tests.helpers.outcomes import outcome
from tests.helpers.pacing import allow_pacing, greedy_outputs, pace_all, tiny_model
from tests.helpers.waiting import wait_for
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(900)]

ENGINE = ["--threads", "1", "--kv-blocks", "192", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
PROMPTS = [f"Write a short story about a lighthouse keeper named Keeper {i}." for i in range(4)]
LATER = [f"Describe the harbour town of Port {i} in spring." for i in range(4)]  # cached nowhere before
MAX_TOKENS = 96
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory, "elastic")


@pytest.fixture(scope="module")
def reference(model):
    outputs = greedy_outputs(model, PROMPTS + LATER, MAX_TOKENS)
    return outputs[:len(PROMPTS)], outputs[len(PROMPTS):]


@pytest.fixture()
def fleet(model):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    allow_pacing(sup)
    secured = cluster_flags(sup.workdir)
    engine = [*ENGINE, "--model", model]
    children = {name: sup.spawn(name, [role, "--port", "0", *engine, *secured, *extra])
                for name, role, extra in (("P", "prefill", []), ("D", "decode", []), ("E", "decode", ["--elastic"]))}
    pace_all(sup, children.values())
    ports = {name: sup.wait_ready(child, 240) for name, child in children.items()}
    router = sup.spawn("router", ["router", "--port", "0", "--model", model, "--prefill-workers",
                                  f"127.0.0.1:{ports['P']}",
                                  "--decode-workers", f"127.0.0.1:{ports['D']},127.0.0.1:{ports['E']}", *secured])
    target = f"127.0.0.1:{sup.wait_ready(router, 240)}"
    wait_serving(target, 60)
    try:
        yield {"sup": sup, "target": target, "children": children,
               "address": {name: f"127.0.0.1:{port}" for name, port in ports.items()}}
    finally:
        sup.stop()


def _set_role(fleet, role: str) -> wpb.SetRoleResponse:
    with grpc.insecure_channel(fleet["address"]["E"]) as channel:
        return worker_pb2_grpc.WorkerControlStub(channel).SetRole(
            wpb.SetRoleRequest(role=role), metadata=cluster_metadata(fleet["sup"].workdir), timeout=10)


def _stats(fleet, name: str) -> wpb.WorkerStats:
    return worker_stats(fleet["address"][name], "decode" if name != "P" else "prefill")


def _sent(fleet) -> int:
    """KV bytes E sent as a prefill worker (its PrefillWorker's Stats)."""
    return sum(worker_stats(fleet["address"]["E"], "prefill").kv_rank_bytes)


def _read(client: Client, prompt: str):
    collector = Collector(now())
    for chunk in client.stream(prompt, **GREEDY):
        collector.add(chunk, now())
    return collector.completion


def _streams(fleet, prompts, during):
    """Every prompt streamed at once; `during()` runs once E decodes one of them."""
    with Client(fleet["target"], ClientOptions(timeout_s=400)) as client:
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(outcome, _read, client, p) for p in prompts]
            wait_for(lambda: _stats(fleet, "E").requests_running > 0, 120, "E decoding a stream")
            during()
            return [f.result() for f in futures]


def _zero_blocks(fleet) -> None:
    for name in ("P", "D", "E"):
        wait_for(lambda n=name: _stats(fleet, n).blocks_active == 0 or None, 30, f"{name} holding no block")


def test_an_elastic_worker_changes_role_under_load_and_back(fleet, reference):
    reference, later = reference
    answer = {}
    results = _streams(fleet, PROMPTS, lambda: answer.setdefault("set", _set_role(fleet, "prefill")))
    assert (answer["set"].role, answer["set"].next_role) == ("decode", "prefill")  # it held streams
    assert [tuple(r.token_ids) for r in results] == reference  # the streams it held moved to D, or finished
    wait_for(lambda: _stats(fleet, "E").role == "prefill" or None, 60, "E serving the prefill role")
    # E prefills now: P drains (SIGTERM; holding nothing, it exits), so E is the one prefill worker left
    os.killpg(fleet["children"]["P"].process.pid, signal.SIGTERM)
    fleet["children"]["P"].process.wait(30)
    with Client(fleet["target"], ClientOptions(timeout_s=400)) as client:
        with concurrent.futures.ThreadPoolExecutor(len(LATER)) as pool:
            again = list(pool.map(lambda prompt: tuple(client.generate(prompt, **GREEDY).token_ids), LATER))
    assert again == later
    assert _sent(fleet) > 0  # E sent their KV to D
    assert _set_role(fleet, "decode").role == "decode"  # no prefill held: at once
    for name in ("D", "E"):
        wait_for(lambda n=name: _stats(fleet, n).blocks_active == 0 or None, 30, f"{name} holding no block")


def test_a_change_called_off_keeps_the_role(fleet):
    with grpc.insecure_channel(fleet["address"]["E"]) as channel:
        stub = worker_pb2_grpc.WorkerControlStub(channel)
        md = cluster_metadata(fleet["sup"].workdir)
        assert stub.SetRole(wpb.SetRoleRequest(role="decode"), metadata=md, timeout=10).next_role == ""
        with pytest.raises(grpc.RpcError) as refused:
            stub.SetRole(wpb.SetRoleRequest(role="router"), metadata=md, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as unauthenticated:
            stub.SetRole(wpb.SetRoleRequest(role="prefill"), timeout=10)
        assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _stats(fleet, "E").role == "decode" and not _stats(fleet, "E").next_role


def test_an_elastic_worker_killed_while_changing_role_loses_nothing(fleet, reference):
    reference, _ = reference
    def kill_mid_change():
        assert _set_role(fleet, "prefill").next_role == "prefill"
        os.killpg(fleet["children"]["E"].process.pid, signal.SIGKILL)

    results = _streams(fleet, PROMPTS, kill_mid_change)
    for result, expected in zip(results, reference):
        assert not isinstance(result, PdserveError), result
        assert tuple(result.token_ids) == expected  # E's streams resumed on D
    for name in ("P", "D"):
        wait_for(lambda n=name: _stats(fleet, n).blocks_active == 0 or None, 30, f"{name} holding no block")


def test_an_elastic_worker_stalled_while_changing_role_loses_nothing_then_changes(fleet, reference):
    """SIGSTOP while it leaves the decode role holding streams: they resume on D (the router gives
    up on a silent worker's calls); after SIGCONT the calls it held are closed, so it changes."""
    reference, _ = reference
    e = fleet["children"]["E"].process.pid

    def stall_mid_change():
        assert _set_role(fleet, "prefill").next_role == "prefill"
        time.sleep(1.0)  # two health polls: the router places nothing more on E (only the test's speed depends on it)
        os.killpg(e, signal.SIGSTOP)

    try:
        results = _streams(fleet, PROMPTS, stall_mid_change)
    finally:
        os.killpg(e, signal.SIGCONT)
    for result, expected in zip(results, reference):
        assert not isinstance(result, PdserveError), result
        assert tuple(result.token_ids) == expected
    wait_for(lambda: _stats(fleet, "E").role == "prefill" or None, 60, "E serving the prefill role")
    _zero_blocks(fleet)


def test_a_cancelled_stream_lets_the_change_finish(fleet):
    """Two long streams, one on each decode worker; E is told to change while it holds one; both
    are cancelled: E's work is over, so it changes."""
    with Client(fleet["target"], ClientOptions(timeout_s=400)) as client:
        streams = [client.stream(p, max_tokens=400, temperature=0, ignore_eos=True) for p in PROMPTS[:2]]
        for stream in streams:
            next(iter(stream))
        wait_for(lambda: _stats(fleet, "E").requests_running > 0 or None, 60, "E decoding a stream")
        assert _set_role(fleet, "prefill").next_role == "prefill"
        assert _stats(fleet, "E").next_role == "prefill"
        for stream in streams:
            stream.cancel()
    wait_for(lambda: _stats(fleet, "E").role == "prefill" or None, 60, "E serving the prefill role")
    assert _set_role(fleet, "decode").role == "decode"  # nothing held: at once
    _zero_blocks(fleet)
