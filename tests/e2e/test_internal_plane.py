"""The internal plane, closed by default, tried as an outsider and as a confused insider would:
services refuse to start open without --insecure; the registry lives on the router's internal
port behind the cluster token, capped and keyed by address; KV RPCs need the reservation's
secret; every internal field is checked before work. After every refusal the workers serve a
canary unchanged and hold no block."""

from __future__ import annotations

import json
import math
import os

import grpc
import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions
from pdserve.procs.health import wait_serving
from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc
from tests.helpers.cluster import cluster_flags, cluster_metadata
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ENV = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"}
ENGINE = ["--threads", "1", "--kv-blocks", "96", "--host-kv-blocks", "16", "--token-budget", "256",
          "--max-chunk-tokens", "64"]
PROMPT = list(range(10, 50))  # 40 tokens: 3 blocks of 16
MAX_TOKENS = 6
GREEDY = pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
REFUSED = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def fleet():
    sup = Supervisor(env=ENV)
    secured = cluster_flags(sup.workdir)
    try:
        decode = sup.spawn("decode", ["decode", "--port", "0", *ENGINE, *secured])
        prefill = sup.spawn("prefill", ["prefill", "--port", "0", *ENGINE, *secured])
        d, p = sup.wait_ready(decode, 300), sup.wait_ready(prefill, 300)
        router = sup.spawn("router", ["router", "--port", "0", "--internal-port", "0", "--max-registered-workers", "2",
                                      "--prefill-workers", f"127.0.0.1:{p}", "--decode-workers", f"127.0.0.1:{d}",
                                      "--kv-timeout", "10", *secured])
        target = f"127.0.0.1:{sup.wait_ready(router, 300)}"
        wait_serving(target, 60)
        internal = f"127.0.0.1:{json.loads(router.ready_file.read_text())['internal_port']}"
        fleet = {"sup": sup, "router": target, "internal": internal, "decode": f"127.0.0.1:{d}",
                 "prefill": f"127.0.0.1:{p}", "token": cluster_metadata(sup.workdir)}
        fleet["canary"] = _generate(target)
        fleet["layout"] = _a_reservation(fleet)
        yield fleet
    finally:
        sup.stop()


def _a_reservation(fleet) -> wpb.KVReservation:
    """A reservation of the decode worker, withdrawn at once: its layout and addresses are real."""
    with grpc.insecure_channel(fleet["decode"]) as channel:
        stream = worker_pb2_grpc.DecodeWorkerStub(channel).Decode(
            wpb.DecodeRequest(request=_worker_request("layout")), metadata=fleet["token"], timeout=60)
        reserved = next(stream).reserved
        stream.cancel()
    return reserved


def _generate(target: str) -> list[int]:
    with Client(target, ClientOptions(timeout_s=120)) as client:
        return client.generate(token_ids=PROMPT, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True).token_ids


def _code(call) -> grpc.StatusCode:
    try:
        result = call()
        if hasattr(result, "__iter__"):
            list(result)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _worker_request(request_id: str, **fields) -> wpb.WorkerRequest:
    values = {"prompt_token_ids": PROMPT, "sampling": GREEDY, "priority": pb.PRIORITY_NORMAL, "kv_timeout_s": 10.0,
              **fields}
    return wpb.WorkerRequest(request_id=request_id, **values)


def _still_serving(fleet) -> None:
    """Every process up, the canary unchanged, no block held anywhere."""
    assert not [c.name for c in fleet["sup"].children if c.exited()]
    assert _generate(fleet["router"]) == fleet["canary"]
    wait_no_active_blocks(fleet)


def test_services_refuse_to_start_open_unless_insecure(tmp_path):
    sup = Supervisor(env=ENV, workdir=tmp_path)
    try:
        refused = [sup.spawn(f"open-{role}", [role, "--port", "0"]) for role in ("router", "prefill", "decode")]
        for child in refused:
            assert child.process.wait(120) == 1
            assert "--insecure" in sup.log_of(child).read_text()
        insecure = sup.spawn("insecure-decode", ["decode", "--port", "0", "--transport", "none", "--insecure", *ENGINE])
        assert sup.wait_ready(insecure, 300) > 0
    finally:
        sup.stop()


def test_the_registry_is_on_the_internal_port_only_behind_the_token_capped_and_deduplicated(fleet):
    token, wrong = fleet["token"], (("authorization", "Bearer not-the-cluster-token"),)

    def register(target: str, address: str, role: str = "decode", metadata=token) -> grpc.StatusCode:
        with grpc.insecure_channel(target) as channel:
            stub = worker_pb2_grpc.RegistryStub(channel)
            return _code(lambda: stub.Register(wpb.RegisterRequest(address=address, role=role), metadata=metadata,
                                               timeout=10))

    assert register(fleet["router"], "127.0.0.1:9") == grpc.StatusCode.UNIMPLEMENTED
    assert register(fleet["internal"], "127.0.0.1:9", metadata=()) == grpc.StatusCode.UNAUTHENTICATED
    assert register(fleet["internal"], "127.0.0.1:9", metadata=wrong) == grpc.StatusCode.UNAUTHENTICATED
    assert register(fleet["internal"], "127.0.0.1:9") == grpc.StatusCode.OK
    assert register(fleet["internal"], "127.0.0.1:9") == grpc.StatusCode.OK  # a heartbeat, not a second worker
    assert register(fleet["internal"], "127.0.0.1:10") == grpc.StatusCode.OK
    assert register(fleet["internal"], "127.0.0.1:11") == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert register(fleet["internal"], "127.0.0.1:9", role="prefill") == REFUSED
    assert register(fleet["internal"], "not an address") == REFUSED
    _still_serving(fleet)


def test_kv_rpcs_need_the_reservations_secret_and_valid_fields(fleet):
    """A live reservation, poked at with a wrong secret and bad fields, still takes the real
    prefill afterwards: every refusal left it as it was."""
    token = fleet["token"]
    with grpc.insecure_channel(fleet["decode"]) as d_channel, grpc.insecure_channel(fleet["prefill"]) as p_channel:
        decode, prefill = worker_pb2_grpc.DecodeWorkerStub(d_channel), worker_pb2_grpc.PrefillWorkerStub(p_channel)
        stream = decode.Decode(wpb.DecodeRequest(request=_worker_request("kv-1")), metadata=token, timeout=120)
        reserved = next(stream).reserved
        assert len(reserved.kv_secret) == 16 and len(reserved.block_ids) == 3

        def push(secret=reserved.kv_secret, metadata=token, **fields):
            piece = {"transfer_id": reserved.transfer_id, "seq": 0, "block_index": 0, "src_block_ids": [1],
                     "timeout_s": 5.0, **fields}
            return _code(lambda: decode.PushKV(wpb.KVPiece(kv_secret=secret, **piece), metadata=metadata, timeout=10))

        def complete(secret=reserved.kv_secret, transfer_id=reserved.transfer_id, **fields):
            message = wpb.KVComplete(transfer_id=transfer_id, kv_secret=secret, **fields)
            return _code(lambda: decode.CompleteKV(message, metadata=token, timeout=10))

        assert push(metadata=()) == grpc.StatusCode.UNAUTHENTICATED
        assert push(secret=b"x" * 16) == push(secret=b"") == grpc.StatusCode.PERMISSION_DENIED
        assert complete(secret=b"x" * 16, num_pieces=1, first_token_id=5) == grpc.StatusCode.PERMISSION_DENIED
        assert push(block_index=3) == push(src_block_ids=[]) == push(block_index=2, src_block_ids=[1, 2]) == REFUSED
        assert push(timeout_s=0.0) == push(timeout_s=601.0) == push(timeout_s=math.nan) == REFUSED
        assert push(seq=3) == REFUSED
        assert complete(num_pieces=0, first_token_id=4294967295) == REFUSED
        assert complete(num_pieces=1, first_token_id=5) == REFUSED  # nothing was announced
        assert complete(transfer_id="nobody#0", num_pieces=0, first_token_id=4294967295) == REFUSED
        assert not [c.name for c in fleet["sup"].children if c.exited()]

        for bad in ({"decode_endpoint": "nowhere"}, {"decode_endpoint": "127.0.0.1:0"}, {"transport": "tcp"},
                    {"kv_secret": b"short"}, {"block_ids": [0, 1, 96]}, {"block_ids": [0, 0, 1]},
                    {"block_ids": [0, 1]}, {"num_blocks": 2}, {"block_size": 32}, {"kv_address": b""}):
            target = wpb.KVReservation()
            target.CopyFrom(reserved)
            for name, value in bad.items():
                target.ClearField(name)
                if isinstance(value, list):
                    getattr(target, name).extend(value)
                else:
                    setattr(target, name, value)
            request = wpb.PrefillRequest(request=_worker_request("kv-1"), target=target)
            assert _code(lambda: prefill.Prefill(request, metadata=token, timeout=30)) == REFUSED, bad

        foreign = wpb.KVReservation()
        foreign.CopyFrom(reserved)
        foreign.identity = "0" * 16  # a decode worker of another model or layout: refused, nothing sent
        request = wpb.PrefillRequest(request=_worker_request("kv-1"), target=foreign)
        assert _code(lambda: prefill.Prefill(request, metadata=token, timeout=30)) == \
            grpc.StatusCode.FAILED_PRECONDITION

        request = wpb.PrefillRequest(request=_worker_request("kv-1"), target=reserved)
        events = prefill.Prefill(request, metadata=token, timeout=120)
        done = [e.done for e in events if e.WhichOneof("event") == "done"]
        decoded = [t for e in stream if e.WhichOneof("event") == "tokens" for t in e.tokens.token_ids]
        assert [done[0].first_token_id, *decoded] == fleet["canary"]
    _still_serving(fleet)


def test_a_prefix_probe_longer_than_any_prompt_is_refused(fleet):
    with grpc.insecure_channel(fleet["prefill"]) as channel:
        stub = worker_pb2_grpc.PrefillWorkerStub(channel)
        probe = wpb.MatchPrefixRequest(token_ids=[7] * 300_000)
        assert _code(lambda: stub.MatchPrefix(probe, metadata=fleet["token"], timeout=30)) == REFUSED
        assert stub.MatchPrefix(wpb.MatchPrefixRequest(token_ids=PROMPT), metadata=fleet["token"], timeout=30)
    _still_serving(fleet)


@pytest.mark.parametrize("fields", [
    {"prompt_token_ids": []}, {"prompt_token_ids": [10, 1 << 30]}, {"kv_timeout_s": 1e6}, {"kv_timeout_s": -1.0},
    {"kv_timeout_s": math.inf}, {"request_id": "x" * 5000}, {"request_id": "bad\nid"}, {"request_id": ""},
    {"priority": 99}, {"output_token_ids": [5] * MAX_TOKENS}, {"age_s": -1.0}, {"age_s": math.nan},
    {"age_s": 1e9},
])
def test_worker_requests_are_checked_before_any_work(fleet, fields):
    token = fleet["token"]
    fields = dict(fields)
    request_id = fields.pop("request_id", "checked")
    with grpc.insecure_channel(fleet["decode"]) as d_channel, grpc.insecure_channel(fleet["prefill"]) as p_channel:
        decode, prefill = worker_pb2_grpc.DecodeWorkerStub(d_channel), worker_pb2_grpc.PrefillWorkerStub(p_channel)
        for local in (True, False):
            message = wpb.DecodeRequest(request=_worker_request(request_id, **fields), local_prefill=local)
            assert _code(lambda: decode.Decode(message, metadata=token, timeout=30)) == REFUSED, (fields, local)
        message = wpb.PrefillRequest(request=_worker_request(request_id, **fields), target=fleet["layout"])
        assert _code(lambda: prefill.Prefill(message, metadata=token, timeout=30)) == REFUSED, fields
    _still_serving(fleet)
