"""Rank 0's watch over its followers runs on the settings the ranks were started with, and an
idle worker hears of a lost follower from it."""

from __future__ import annotations

import threading

import pytest

from pdserve.parallel.config import TensorParallelConfig
from pdserve.parallel.leader import start_leader
from pdserve.parallel.ranks import Alone, RankFailed
from pdserve.parallel.watch import RankWatch
from tests.parallel.conftest import tp_config

pytestmark = pytest.mark.timeout(120)


def test_the_leaders_settings_reach_its_followers_group(tiny_model_dirs):
    tp = TensorParallelConfig(watch_s=0.05, stop_grace_s=2.0)
    followers = start_leader(tp_config(tiny_model_dirs["llama_gqa_llama3"], 2), tp).followers
    lost: list[RankFailed] = []
    heard = threading.Event()
    watch = RankWatch(followers, lambda exc: (lost.append(exc), heard.set())).start()
    try:
        assert followers.config is tp
        followers.procs[0].kill()
        assert heard.wait(30)
    finally:
        watch.stop()
        followers.close()
    assert len(lost) == 1 and "rank 1" in str(lost[0])


def test_a_single_rank_has_the_default_settings():
    assert Alone().config == TensorParallelConfig()
