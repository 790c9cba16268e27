"""--tensor-parallel-size reaches the engine config from `pdserve decode`/`prefill` and from
`pdserve up` to its workers; a prefill worker refuses a size above one (its KV sender would send
rank 0's heads only)."""

from __future__ import annotations

import pytest

from pdserve.cli.main import build_parser
from pdserve.cli.options import runtime_config
from pdserve.cli.up import worker_argv
from pdserve.config import EngineConfig
from pdserve.worker.runtime import build_runtime


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


def test_a_prefill_worker_refuses_more_than_one_rank():
    config = runtime_config(build_parser().parse_args(["prefill", "--tensor-parallel-size", "2"]))
    with pytest.raises(ValueError, match="prefill worker runs at tensor parallel size 1, not 2"):
        build_runtime(config, hold_blocks=True)
