"""A rank killed while its worker's KV is in flight across tensor-parallel layouts: the worker
fails as a whole (every rank exits, with the engine-failure code), the request ends with a
status or resumes elsewhere, never a hang, and the surviving worker returns to zero active
blocks.

A transfer is held in flight by stopping (SIGSTOP) a decode follower: its KV agent posts
nothing, so the prefill rank that sends it its share waits, holding the piece's blocks."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from pdserve.cli.services import EXIT_ENGINE_FAILED
from pdserve.client import PdserveError
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats
from tests.parallel.procs import alive, children
from tests.parallel.test_tp_disaggregated import fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
PROMPT = [1, *range(3, 60)]
ENDS = ("UNAVAILABLE", "INTERNAL", "ABORTED", "DEADLINE_EXCEEDED", "CANCELLED")


def generate_in_background(client) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["out"] = client.generate(token_ids=PROMPT, max_tokens=4, temperature=0, ignore_eos=True)
        except PdserveError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


def sending(addresses) -> bool:
    """A piece's send is in flight: the prefill worker holds its blocks."""
    return worker_stats(addresses["prefill"], "prefill").blocks_held > 0


def idle(address: str, role: str) -> bool:
    return worker_stats(address, role).blocks_active == 0


def test_a_decode_follower_killed_during_a_transfer_fails_its_worker_and_frees_the_prefill_worker(tiny_model_dirs):
    with fleet(tiny_model_dirs["qwen2_bias"], 1, 2) as (sup, _, decode, addresses, client):
        (follower,) = children(decode.pid)
        os.kill(follower, signal.SIGSTOP)
        thread, outcome = generate_in_background(client)
        wait_until(lambda: sending(addresses), 120, "the prefill worker sending the stopped rank its share")
        os.kill(follower, signal.SIGKILL)
        thread.join(60)
        assert not thread.is_alive(), "the request hangs"
        assert "error" in outcome and outcome["error"].code in ENDS
        assert sup.wait_exit(decode, 30) == EXIT_ENGINE_FAILED
        wait_until(lambda: idle(addresses["prefill"], "prefill"), 30, "zero active blocks on the prefill worker")


def test_a_prefill_follower_killed_during_a_transfer_fails_its_worker_and_frees_the_decode_worker(tiny_model_dirs):
    with fleet(tiny_model_dirs["qwen2_bias"], 2, 2) as (sup, prefill, decode, addresses, client):
        (decode_follower,), (prefill_follower,) = children(decode.pid), children(prefill.pid)
        os.kill(decode_follower, signal.SIGSTOP)
        try:
            thread, outcome = generate_in_background(client)
            wait_until(lambda: sending(addresses), 120, "prefill rank 1 sending the stopped decode rank its share")
            os.kill(prefill_follower, signal.SIGKILL)
            assert sup.wait_exit(prefill, 30) == EXIT_ENGINE_FAILED
        finally:
            os.kill(decode_follower, signal.SIGCONT)
        thread.join(90)
        assert not thread.is_alive(), "the request hangs"
        assert "out" in outcome or outcome["error"].code in ENDS
        wait_until(lambda: not alive(prefill_follower), 15, "every prefill rank exits")
        wait_until(lambda: idle(addresses["decode"], "decode"), 60, "zero active blocks on the decode worker")
        assert alive(decode.pid) and alive(decode_follower)
