"""The worker's typed runtime config comes from the engine flags, built once in the CLI."""

from __future__ import annotations

import argparse

from pdserve.cli.options import add_engine_flags, engine_config, runtime_config
from pdserve.worker.runtime import RuntimeConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    return parser.parse_args(list(argv))


def test_runtime_config_holds_the_engine_config_and_threads():
    args = parse("--threads", "3", "--kv-blocks", "64", "--policy", "fcfs")
    config = runtime_config(args)
    assert isinstance(config, RuntimeConfig)
    assert config == RuntimeConfig(engine_config(args), threads=3)
    assert (config.engine.cache.num_blocks, config.engine.scheduler.policy) == (64, "fcfs")


def test_threads_default_to_all_cores():
    assert runtime_config(parse()).threads is None
