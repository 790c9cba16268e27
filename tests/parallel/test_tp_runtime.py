"""A worker runtime at tensor parallel size 2: a follower lost while the worker is idle is
reported to the failure listeners at once (the worker then leaves rotation and exits), and
stopping the runtime stops every rank."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.parallel.ranks import RankFailed
from pdserve.worker.runtime import RuntimeConfig, build_runtime
from tests.parallel.conftest import tp_config

pytestmark = pytest.mark.timeout(120)


def test_an_idle_worker_hears_of_a_lost_rank_and_stops_every_rank(tiny_model_dirs):
    async def main():
        runtime = build_runtime(RuntimeConfig(tp_config(tiny_model_dirs["qwen2_bias"], 2), threads=1),
                                hold_blocks=False)
        heard: asyncio.Queue[BaseException] = asyncio.Queue()
        procs = runtime.engine.loaded.ranks.procs
        try:
            runtime.on_failure(heard.put_nowait)
            procs[0].kill()
            return await asyncio.wait_for(heard.get(), 20), procs
        finally:
            runtime.stop()

    exc, procs = asyncio.run(main())
    assert isinstance(exc, RankFailed) and "rank 1" in str(exc)
    assert all(p.poll() is not None for p in procs)
