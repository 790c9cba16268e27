"""The flags' defaults, now read from the configs, keep the values they had as literals."""

from __future__ import annotations

import pytest

from pdserve.cli import main
from pdserve.cli.options import engine_config

ENGINE = {"model": None, "device": "cpu", "dtype": "auto", "attention_backend": "auto", "kv_blocks": 2048,
          "host_kv_blocks": 2048, "block_size": 16, "token_budget": None, "max_chunk_tokens": None,
          "policy": "chunked", "max_model_len": None, "recompute_below_tokens": 2048, "swap_above_tokens": 16384,
          "max_num_seqs": 256}


def _defaults(argv: list[str], monkeypatch) -> dict:
    monkeypatch.delenv("PDSERVE_DRAIN_TIMEOUT_S", raising=False)
    return vars(main.build_parser().parse_args(argv))


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_worker_defaults(role, monkeypatch):
    args = _defaults([role], monkeypatch)
    assert {k: args[k] for k in ENGINE} == ENGINE
    assert (args["drain_timeout_s"], args["quarantine_timeout_s"]) == (30.0, 60.0)
    assert args["port"] == {"prefill": 50061, "decode": 50071}[role]


def test_router_defaults(monkeypatch):
    args = _defaults(["router"], monkeypatch)
    assert (args["kv_timeout"], args["wait_for_worker_s"], args["drain_timeout_s"]) == (30.0, 5.0, 30.0)
    assert (args["port"], args["max_active"], args["max_registered_workers"]) == (50051, 1024, 256)


def test_router_drain_default_from_the_environment(monkeypatch):
    monkeypatch.setenv("PDSERVE_DRAIN_TIMEOUT_S", "7")
    assert main.build_parser().parse_args(["router"]).drain_timeout_s == 7.0


def test_up_defaults(monkeypatch):
    args = _defaults(["up"], monkeypatch)
    assert {k: args[k] for k in ENGINE} == ENGINE
    assert (args["port"], args["kv_timeout"], args["drain_timeout_s"]) == (50051, 30.0, 30.0)


def test_generate_sampling_defaults(monkeypatch):
    args = _defaults(["generate", "hello"], monkeypatch)
    assert (args["max_tokens"], args["temperature"], args["top_p"], args["top_k"], args["min_p"], args["seed"]) == \
        (128, 0.0, 1.0, 0, 0.0, None)


@pytest.mark.parametrize("device, budget", [("cpu", 512), ("cuda", 2048)])
def test_token_budget_by_device(device, budget, monkeypatch):
    config = engine_config(main.build_parser().parse_args(["decode", "--device", device]))
    assert (config.scheduler.token_budget, config.scheduler.max_chunk_tokens) == (budget, budget // 2)


def test_max_num_seqs_bounds_the_requests_a_worker_runs(monkeypatch):
    config = engine_config(main.build_parser().parse_args(["decode", "--max-num-seqs", "8"]))
    assert config.scheduler.max_running == 8
    with pytest.raises(SystemExit, match="at least 1"):
        engine_config(main.build_parser().parse_args(["decode", "--max-num-seqs", "0"]))


def test_deterministic_reaches_every_engine_and_up_passes_it_on():
    from pdserve.cli import up

    for command in (["decode"], ["prefill"], ["generate", "hi"]):
        assert not engine_config(main.build_parser().parse_args(command)).deterministic
        assert engine_config(main.build_parser().parse_args([*command, "--deterministic"])).deterministic
    for command in ("up", "serve"):
        argv = up.worker_argv(main.build_parser().parse_args([command, "--deterministic", "--cluster-token-file", "t"]),
                              "decode")
        assert "--deterministic" in argv
    assert "--deterministic" not in up.worker_argv(main.build_parser().parse_args(["up", "--cluster-token-file", "t"]),
                                                   "decode")


def test_serve_takes_the_model_first_and_every_up_flag(monkeypatch):
    from pdserve.cli import up

    args = _defaults(["serve", "/models/x.gguf", "--decode-workers", "2", "--max-num-seqs", "64"], monkeypatch)
    assert (args["model_path"], args["decode_workers"], args["http_port"]) == ("/models/x.gguf", 2, 8000)
    ran = {}
    monkeypatch.setattr(up, "run", lambda parsed: ran.setdefault("model", parsed.model))
    args_ns = main.build_parser().parse_args(["serve", "/models/x.gguf"])
    args_ns.run(args_ns)
    assert ran["model"] == "/models/x.gguf"
    assert "--max-num-seqs" in up.worker_argv(main.build_parser().parse_args(["serve", "--max-num-seqs", "64",
                                                                               "--cluster-token-file", "t"]), "decode")


def test_up_puts_each_of_its_routers_on_ports_of_its_own_in_front_of_the_same_workers(monkeypatch):
    from pdserve.cli import up

    args = main.build_parser().parse_args(["up", "--routers", "3", "--port", "6000", "--http-port", "0",
                                           "--wait-for-worker-s", "2", "--cluster-token-file", "t"])
    workers = {"prefill": ["127.0.0.1:1"], "decode": ["127.0.0.1:2", "127.0.0.1:3"]}
    argvs = [up.router_argv(args, workers, i) for i in range(args.routers)]

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    assert [flag(a, "--port") for a in argvs] == ["6000", "6001", "6002"]
    assert [flag(a, "--http-port") for a in argvs] == ["0", "0", "0"]  # any free port, each its own
    assert {(flag(a, "--prefill-workers"), flag(a, "--decode-workers"), flag(a, "--wait-for-worker-s"))
            for a in argvs} == {("127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3", "2.0")}
    assert _defaults(["up"], monkeypatch)["routers"] == 1
    with pytest.raises(SystemExit):
        main.build_parser().parse_args(["up", "--routers", "0"])


@pytest.mark.timeout(30)
def test_chunks_sized_by_time_reach_the_scheduler_and_up_passes_them_on():
    from pdserve.cli import up

    scheduler = engine_config(main.build_parser().parse_args(["decode"])).scheduler
    assert (scheduler.chunking, scheduler.step_time_target_s, scheduler.min_chunk_tokens) == ("tokens", 0.1, 32)
    flags = ["--chunking", "time", "--step-time-target-ms", "50", "--min-chunk-tokens", "16"]
    scheduler = engine_config(main.build_parser().parse_args(["prefill", *flags])).scheduler
    assert (scheduler.chunking, scheduler.step_time_target_s, scheduler.min_chunk_tokens) == ("time", 0.05, 16)
    argv = up.worker_argv(main.build_parser().parse_args(["up", *flags, "--cluster-token-file", "t"]), "decode")
    assert all(flag in argv for flag in ("--chunking", "time", "--step-time-target-ms", "50.0", "--min-chunk-tokens"))
    with pytest.raises(SystemExit, match="step-time-target-ms"):
        engine_config(main.build_parser().parse_args(["decode", "--step-time-target-ms", "0"]))
