"""The ranks of a worker fail as one: a follower killed between steps or during one fails rank
0's next step loudly and every other rank exits; rank 0 killed makes every follower exit. Never
a hang (each test has a timeout; the collectives have their own)."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pdserve.engine.engine import Engine
from pdserve.parallel.communicator import CollectiveError
from pdserve.parallel.ranks import RankFailed
from pdserve.requests import SamplingParams
from tests.engine.driver import tiny_prompt
from tests.helpers.waiting import wait_until
from tests.parallel.conftest import tp_config
from tests.parallel.procs import alive

pytestmark = pytest.mark.timeout(120)
LONG = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)


def _start(path, tp: int) -> tuple[Engine, list[subprocess.Popen]]:
    engine = Engine(tp_config(path, tp, num_blocks=256))
    engine.add_request("r", tiny_prompt(40, 384, seed=1), LONG)
    return engine, engine.loaded.ranks.procs


def test_a_follower_killed_between_steps_fails_the_next_step_and_stops_the_others(tiny_model_dirs):
    engine, procs = _start(tiny_model_dirs["llama_untied"], 4)
    try:
        for _ in range(3):
            engine.step()
        procs[1].kill()
        procs[1].wait(10)
        with pytest.raises(RankFailed, match=r"rank 2 \(pid \d+\) exited with code -9"):
            engine.step()
        assert all(p.poll() is not None for p in procs)
    finally:
        engine.loaded.ranks.close()


def test_a_follower_killed_during_steps_fails_a_step_and_every_rank_exits(tiny_model_dirs):
    engine, procs = _start(tiny_model_dirs["llama_gqa_llama3"], 2)
    killer = threading.Timer(0.5, procs[0].kill)
    try:
        killer.start()
        with pytest.raises((RankFailed, CollectiveError)):
            for i in itertools.count():  # steps until the kill lands, however fast the machine steps
                if not engine.has_unfinished():
                    engine.add_request(f"r{i}", tiny_prompt(40, 384, seed=1), LONG)
                engine.step()
        assert procs[0].wait(10) == -signal.SIGKILL
    finally:
        killer.cancel()
        engine.loaded.ranks.close()


RANK0 = """
import sys, time
sys.path.insert(0, {root!r})
from pdserve.engine.engine import Engine
from pdserve.requests import SamplingParams
from tests.parallel.conftest import tp_config
from tests.parallel.procs import alive
engine = Engine(tp_config({path!r}, 2))
engine.add_request("r", [1] + [7] * 30, SamplingParams(max_tokens=450, ignore_eos=True, temperature=0.0))
print(" ".join(str(p.pid) for p in engine.loaded.ranks.procs), flush=True)
while engine.has_unfinished():
    engine.step()
time.sleep(600)
"""


def test_followers_exit_when_rank0_is_killed_while_stepping(tiny_model_dirs):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = RANK0.format(root=root, path=str(tiny_model_dirs["llama_gqa_llama3"]))
    rank0 = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in rank0.stdout.readline().split()]
        assert pids and all(alive(p) for p in pids)
        time.sleep(0.5)
        assert rank0.poll() is None
        rank0.kill()
        rank0.wait(10)
        wait_until(lambda: not any(alive(p) for p in pids), timeout_s=15, what="followers exit")
    finally:
        rank0.kill()
        rank0.wait(10)


def test_a_stalled_follower_fails_the_step_at_the_collective_timeout(tiny_model_dirs):
    """SIGSTOPped: rank 0's collective (or its plan, once the pipe is full) gives up after the
    timeout instead of waiting for ever."""
    from pdserve.engine.engine_model import EngineModel
    from pdserve.parallel.config import TensorParallelConfig
    from pdserve.parallel.leader import start_leader

    config = tp_config(tiny_model_dirs["llama_gqa_llama3"], 2)
    loaded = EngineModel.leading(start_leader(config, TensorParallelConfig(collective_timeout_s=3.0)))
    engine = Engine(config, loaded=loaded)
    follower = loaded.ranks.procs[0]
    try:
        engine.add_request("r", tiny_prompt(40, 384, seed=1), LONG)
        engine.step()
        follower.send_signal(signal.SIGSTOP)
        with pytest.raises((RankFailed, CollectiveError)):
            while engine.has_unfinished():
                engine.step()
    finally:
        follower.send_signal(signal.SIGCONT)
        loaded.ranks.close()
    assert follower.poll() is not None
