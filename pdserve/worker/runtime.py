"""Builds what every worker process runs: the engine on its thread and the KV transport."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
from dataclasses import dataclass

import torch

from pdserve.cli.options import engine_config
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.engine.faults import injector_from_env


@dataclass
class WorkerRuntime:
    engine: Engine
    async_engine: AsyncEngine

    @property
    def block_size(self) -> int:
        return self.engine.kv.block_size

    @property
    def block_nbytes(self) -> int:
        return self.engine.kv.block_nbytes

    def stop(self) -> None:
        self.async_engine.stop()


def build_runtime(args: argparse.Namespace, hold_blocks: bool) -> WorkerRuntime:
    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine(engine_config(args), hold_blocks=hold_blocks)
    _quiet_gc()
    async_engine = AsyncEngine(engine, faults=injector_from_env(os.environ))
    async_engine.start(asyncio.get_running_loop())
    return WorkerRuntime(engine, async_engine)


def _quiet_gc() -> None:
    """Move what start-up allocated (model, tokenizer tables) out of the collector's sight and
    collect young objects less often: full collections otherwise pause steps for tens of ms."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
