"""A follower rank: `python -m pdserve.parallel.follower`, started by rank 0 (leader.py).

    stdin:  a FollowerSpec, then plans (plan.py), pickled, until end-of-file
    loop:   plan = next(stdin); plan.run(state)        # its own shard, its own heads' KV pools
    KV:     its KV agent (kv_agent.py) on a thread of its own, answering rank 0 on the spec's socket

It exits when rank 0 closes the pipe, when rank 0's process is gone (end-of-file, or its parent
changed), or when a collective fails or times out; never waits on a dead rank 0.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, BinaryIO

import torch

from pdserve.config import EngineConfig
from pdserve.parallel.config import TensorParallelConfig

if TYPE_CHECKING:
    from pdserve.attention.base import AttentionBackend
    from pdserve.kv.kv_cache import kv_pools
    from pdserve.parallel.communicator import Communicator

EXIT_PARENT_GONE = 3


@dataclass(frozen=True)
class FollowerSpec:
    """What rank 0 tells a follower first: the engine it mirrors, and where to meet."""

    engine: EngineConfig
    rank: int
    store_port: int
    threads: int
    parallel: TensorParallelConfig
    kv_fd: int  # this rank's end of its KV agent socket (inherited)


@dataclass
class FollowerState:
    """A follower's shard and the pools of its heads, built as rank 0's engine builds its own."""

    model: torch.nn.Module
    kv: KVCache
    host_kv: KVCache
    attn: AttentionBackend
    device: torch.device


def rank_device(device: str, rank: int) -> torch.device:
    """cpu -> cpu; cuda[:k] -> cuda:(k + rank): one GPU per rank."""
    base = torch.device(device)
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def store_key(stage: str, rank: int) -> str:
    """The rendezvous keys a follower sets: 'joining' before it joins the group, 'ready' after loading."""
    return f"pdserve-tp/{stage}/{rank}"


def build_state(spec: FollowerSpec, comm: Communicator) -> FollowerState:
    from pdserve.attention import make_attention_backend
    from pdserve.kv.kv_cache import kv_pools
    from pdserve.model.dtypes import kv_cache_dtype, serving_dtype
    from pdserve.parallel.shard_load import load_model_shard

    cfg, device = spec.engine, rank_device(spec.engine.device, spec.rank)
    dtype = serving_dtype(cfg.dtype, device)
    kv_dtype = kv_cache_dtype(cfg.cache.kv_dtype, dtype, device)
    loaded = load_model_shard(cfg.model, device, dtype, comm)
    kv, host_kv = kv_pools(loaded.config.kv_shape(cfg.cache.block_size), loaded.config.page_groups(),
                           cfg.cache.num_blocks, cfg.cache.num_host_blocks, kv_dtype, device)
    attn = make_attention_backend(cfg.attention_backend, device, kv_dtype, compute_dtype=dtype)
    return FollowerState(loaded.model, kv, host_kv, attn, device)


def serve(spec: FollowerSpec, plans: BinaryIO) -> None:
    from torch.distributed import TCPStore

    from pdserve.parallel.communicator import join_group

    torch.set_num_threads(spec.threads)
    tp, world = spec.parallel, spec.engine.tensor_parallel_size
    store = TCPStore(tp.host, spec.store_port, world, is_master=False, timeout=timedelta(seconds=tp.start_timeout_s))
    store.set(store_key("joining", spec.rank), "1")
    device = rank_device(spec.engine.device, spec.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    comm = join_group(store, spec.rank, world, device, tp.collective_timeout_s)
    try:
        state = build_state(spec, comm)
        _start_agent(state, spec.kv_fd)
        store.set(store_key("ready", spec.rank), "1")
        _follow(plans, state)
    finally:
        comm.close()


def _start_agent(state: FollowerState, kv_fd: int) -> None:
    import socket

    from pdserve.parallel.kv_agent import KVAgent

    KVAgent(state.kv.data, socket.socket(fileno=kv_fd)).start()


def _follow(plans: BinaryIO, state: FollowerState) -> None:
    with torch.inference_mode():
        while True:
            try:
                plan = pickle.load(plans)
            except EOFError:
                return
            plan.run(state)


def _watch_parent(parent: int, interval_s: float) -> None:
    """Rank 0's process gone (this process re-parented): exit at once, whatever this rank waits on."""
    while os.getppid() == parent:
        time.sleep(interval_s)
    os._exit(EXIT_PARENT_GONE)


def main() -> None:
    """SIGTERM and SIGINT reach the whole process group (a supervisor's stop, Ctrl-C): rank 0
    drains or stops and then closes the followers, which therefore ignore both."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent, plans = os.getppid(), sys.stdin.buffer
    spec = pickle.load(plans)
    threading.Thread(target=_watch_parent, args=(parent, spec.parallel.watch_s), name="parent-watch",
                     daemon=True).start()
    serve(spec, plans)


if __name__ == "__main__":
    main()
