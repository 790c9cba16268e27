"""Rank 0 of a tensor-parallel worker: starts the follower ranks, joins them, and runs the
engine's model as the ranks' one model.

    start:  check the split on the model's config (before any process starts), spawn ranks
            1..n-1 (`python -m pdserve.parallel.follower`, rendezvous at a TCPStore on a free
            localhost port), wait until each joined, join, read rank 0's shard of the
            checkpoint (each rank reads its own, shard_load.py), wait until each loaded its shard
    step:   LeaderModel.forward announces the batch, then runs rank 0's shard (the collectives
            meet the followers'); the model runner announces swaps the same way
    KV:     each follower's KV agent (kv_agent.py) answers on a socket pair made here

A follower that dies before it is ready fails the start at once (RankFailed), not at a timeout.
"""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import NamedTuple

import torch
from torch import nn

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch
from pdserve.config import EngineConfig
from pdserve.kv.kv_cache import KVCache
from pdserve.model.dtypes import serving_dtype
from pdserve.model.loader import LoadedModel
from pdserve.checkpoint.source import read_model_config
from pdserve.parallel.config import TensorParallelConfig
from pdserve.parallel.follower import FollowerSpec, rank_device, store_key
from pdserve.parallel.plan import ForwardPlan
from pdserve.parallel.ranks import Followers, RankFailed, RankGroup
from pdserve.parallel.shard import check_tensor_parallel
from pdserve.parallel.shard_load import load_model_shard


class LeaderModel(nn.Module):
    """Rank 0's shard behind the model's interface: each forward is announced first."""

    def __init__(self, shard: nn.Module, ranks: RankGroup):
        super().__init__()
        self.shard = shard
        self.ranks = ranks
        self.config = shard.config

    def forward(self, batch: ForwardBatch, kv: KVCache, attn: AttentionBackend,
                logits: torch.Tensor | None = None) -> torch.Tensor:
        self.ranks.announce(ForwardPlan.of(batch))
        return self.shard.forward(batch, kv, attn, logits)

    @property
    def dtype(self) -> torch.dtype:
        return self.shard.dtype

    @property
    def device(self) -> torch.device:
        return self.shard.device


class RankZero(NamedTuple):
    """What start_leader returns: rank 0's model (a LeaderModel around its shard) and the follower
    ranks it runs with (close them with `followers.close()`)."""

    loaded: LoadedModel
    followers: Followers


def start_leader(config: EngineConfig, tp: TensorParallelConfig = TensorParallelConfig()) -> RankZero:
    """Rank 0 with its followers started and loaded. Raises TensorParallelError (a size that does
    not divide), ModelLoadError, RankFailed."""
    from torch.distributed import TCPStore

    from pdserve.parallel.communicator import join_group

    world, device = config.tensor_parallel_size, rank_device(config.device, 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    check_tensor_parallel(read_model_config(config.model), world)
    store = TCPStore(tp.host, 0, world, is_master=True, timeout=timedelta(seconds=tp.start_timeout_s),
                     wait_for_workers=False)
    links = [socket.socketpair() for _ in range(1, world)]
    procs = [_spawn(FollowerSpec(config, rank, store.port, torch.get_num_threads(), tp, theirs.fileno()))
             for rank, (_, theirs) in enumerate(links, start=1)]
    for _, theirs in links:
        theirs.close()
    comm = None
    followers = Followers(procs, lambda: comm.close() if comm is not None else None, tp,
                          [ours for ours, _ in links])
    try:
        _wait_for(store, followers, "joining", tp)
        comm = join_group(store, 0, world, device, tp.collective_timeout_s)
        loaded = load_model_shard(config.model, device, serving_dtype(config.dtype, device), comm)
        _wait_for(store, followers, "ready", tp)
    except BaseException:
        followers.close()
        raise
    return RankZero(LoadedModel(loaded.config, LeaderModel(loaded.model, followers), loaded.source_path), followers)


def _spawn(spec: FollowerSpec) -> subprocess.Popen:
    """A follower process in this one's process group, its spec already on its stdin, its end of
    the KV agent socket inherited."""
    proc = subprocess.Popen([sys.executable, "-m", "pdserve.parallel.follower"], stdin=subprocess.PIPE,
                            pass_fds=(spec.kv_fd,))
    proc.stdin.write(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    proc.stdin.flush()
    return proc


def _wait_for(store, followers: Followers, stage: str, tp: TensorParallelConfig) -> None:
    """Until every follower set its `stage` key; RankFailed as soon as one exited."""
    keys = [store_key(stage, rank) for rank in range(1, len(followers.procs) + 1)]
    deadline = time.monotonic() + tp.start_timeout_s
    while not store.check(keys):
        if gone := followers.gone():
            raise RankFailed(f"tensor-parallel rank failed to start: {'; '.join(gone)}")
        if time.monotonic() > deadline:
            raise RankFailed(f"tensor-parallel ranks not {stage} after {tp.start_timeout_s:.0f} s")
        time.sleep(tp.poll_s)
