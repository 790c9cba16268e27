"""`pdserve bench` against a real colocated service (router + one worker, small pools, one thread)."""

from __future__ import annotations

import json
import os

import pytest

from pdserve.bench import runner, workloads
from pdserve.bench.records import NOT_SENT, UNFINISHED

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

WORKER_FLAGS = ["--kv-blocks", "128", "--host-kv-blocks", "64", "--threads", "1", "--token-budget", "256",
                "--max-chunk-tokens", "128"]


@pytest.fixture(scope="module")
def target():
    from pdserve.cli.supervisor import Supervisor
    from pdserve.procs.health import wait_serving
    from tests.helpers.cluster import cluster_flags

    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    secured = cluster_flags(sup.workdir)
    try:
        worker = sup.spawn("decode", ["decode", "--port", "0", "--transport", "none", *WORKER_FLAGS, *secured])
        port = sup.wait_ready(worker, 240)
        router = sup.spawn("router", ["router", "--port", "0", "--colocated", "--decode-workers", f"127.0.0.1:{port}",
                                      "--anonymous-max-priority", "vip", *secured])  # the chat workload has VIP
        address = f"127.0.0.1:{sup.wait_ready(router, 240)}"
        wait_serving(address, 60)
        yield address
    finally:
        sup.stop()


def test_bench_cli_runs_a_small_chat_workload(target, tmp_path, capsys):
    from pdserve.cli.main import main

    path = tmp_path / "chat.json"
    rc = main(["bench", "--target", target, "--workload", "chat", "--requests", "4", "--rate", "4",
               "--json", str(path), "--duration-limit", "200"])
    assert rc == 0
    doc = json.loads(path.read_text())
    total = doc["summary"]["all"]
    assert total["requests"] == 4 and total["completed"] == 4 and total["failed"] == {}
    assert total["output_tokens_per_s"] > 0
    expected = [r.max_tokens for r in workloads.build("chat", 4, 4.0, 0).requests]
    assert [r["completion_tokens"] for r in doc["requests"]] == expected
    assert [sum(r["token_counts"]) for r in doc["requests"]] == expected
    assert all(r["prompt_tokens"] > 20 and r["finish_reason"] == "FINISH_REASON_LENGTH" for r in doc["requests"])
    out = capsys.readouterr()
    assert "kind:chat" in out.out and "4/4 done" in out.err


def test_time_limit_cancels_the_stream_in_flight_and_sends_no_more(target):
    long_chats = workloads.ChatShape(max_tokens=(1000, 1000))  # far longer than the limit at any decode speed
    w = workloads.chat(3, 0.05, 1, long_chats)
    result = runner.run(target, w, runner.RunOptions(duration_limit_s=1.0, progress=False))
    assert [r.status for r in result.records] == [UNFINISHED, NOT_SENT, NOT_SENT]
    # the run ends with the stream cut at the limit (how long after the limit that takes is the
    # machine's speed; the bound below is the limit, less the event loop's timer granularity)
    assert result.records[0].done_s == result.duration_s >= 0.5
