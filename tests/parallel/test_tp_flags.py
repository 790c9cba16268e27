"""--tensor-parallel-size reaches the engine config from `pdserve decode`/`prefill` and from
`pdserve up` to its workers."""

from __future__ import annotations

from pdserve.cli.main import build_parser
from pdserve.cli.options import runtime_config
from pdserve.cli.up import worker_argv
from pdserve.config import EngineConfig


def test_the_flag_defaults_to_the_config_and_reaches_the_engine_config():
    parser = build_parser()
    assert runtime_config(parser.parse_args(["decode"])).engine.tensor_parallel_size == EngineConfig().tensor_parallel_size
    config = runtime_config(parser.parse_args(["decode", "--tensor-parallel-size", "2", "--threads", "1"]))
    assert (config.engine.tensor_parallel_size, config.threads) == (2, 1)


def test_up_passes_the_size_to_its_workers(tmp_path):
    args = build_parser().parse_args(["up", "--mode", "colocated", "--tensor-parallel-size", "3"])
    args.cluster_token_file = tmp_path / "token"
    argv = worker_argv(args, "decode")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "3"


def test_a_prefill_worker_takes_the_size_too():
    config = runtime_config(build_parser().parse_args(["prefill", "--tensor-parallel-size", "2"]))
    assert config.engine.tensor_parallel_size == 2
