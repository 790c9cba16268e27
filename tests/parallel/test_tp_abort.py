"""A request aborted while its KV is in flight to a tensor-parallel decode worker: every block
is free at once on every worker, none quarantined and nothing logged at ERROR, as at size 1.
The follower's receive is held in flight by stopping (SIGSTOP) it: nothing it was sent can have
reached its pool, so nothing waits for it to answer."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from pdserve.client import PdserveError
from tests.helpers.waiting import wait_until
from tests.helpers.worker_stats import worker_stats
from tests.parallel.procs import children
from tests.parallel.test_tp_disaggregated import fleet
from tests.parallel.test_tp_transfer_faults import ENDS, PROMPT, sending

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _generate(client, request_id: str) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["out"] = client.generate(token_ids=PROMPT, max_tokens=4, temperature=0, ignore_eos=True,
                                             request_id=request_id)
        except PdserveError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


def _clear(addresses, role: str) -> bool:
    stats = worker_stats(addresses[role], role)
    return stats.blocks_active == 0 and stats.blocks_quarantined == 0


def test_an_abort_mid_transfer_frees_every_block_at_once_and_logs_nothing_at_error(tiny_model_dirs):
    with fleet(tiny_model_dirs["qwen2_bias"], 1, 2) as (sup, _, decode, addresses, client):
        (follower,) = children(decode.pid)
        os.kill(follower, signal.SIGSTOP)
        try:
            thread, outcome = _generate(client, "held")
            wait_until(lambda: sending(addresses), 30, "the prefill worker sending the stopped rank its share")
            assert client.abort("held")
            wait_until(lambda: _clear(addresses, "decode"), 30, "the decode worker's blocks free, the rank stopped")
        finally:
            os.kill(follower, signal.SIGCONT)
        thread.join(60)
        assert not thread.is_alive(), "the request hangs"
        assert outcome["out"].finish_reason == "abort" if "out" in outcome else outcome["error"].code in ENDS
        wait_until(lambda: _clear(addresses, "prefill") and _clear(addresses, "decode"), 60,
                   "zero active and quarantined blocks on every worker")
        out = client.generate(token_ids=PROMPT, max_tokens=4, temperature=0, ignore_eos=True)
        assert len(out.token_ids) == 4
        log = sup.log_of(decode).read_text()
        assert " ERROR " not in log and "quarantined" not in log
