"""Manifests, compose and the CLI agree with the flag tables of deploy/README.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from deploy_contract import ROLES, Invocation, documented_flags, k8s_invocations, parse_command
from deploy_paths import DOCKER, LAYOUTS, README, REPO

BRIEF_FLAGS = {  # what the deployment needs from each role, at the least
    "router": {
        "--port",
        "--prefill-workers",
        "--prefill-dns",
        "--decode-workers",
        "--decode-dns",
        "--metrics-port",
        "--otlp-traces-endpoint",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
        "--cluster-token-file",
        "--api-token-file",
    },
    "prefill": {
        "--port",
        "--model",
        "--kv-blocks",
        "--token-budget",
        "--metrics-port",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
        "--cluster-token-file",
        "--advertise-host",
    },
}
BRIEF_FLAGS["decode"] = BRIEF_FLAGS["prefill"]
ROLE_PORTS = {"router": "50051", "prefill": "50061", "decode": "50071"}


def compose_invocations() -> list[Invocation]:
    services = yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())["services"]
    return [
        parse_command(f"compose/{name}", s["command"])
        for name, s in services.items()
        if "command" in s and name in ROLES
    ]


def all_invocations(rendered) -> list[Invocation]:
    k8s = [call for layout in LAYOUTS for _, call in k8s_invocations(rendered[layout])]
    return k8s + compose_invocations()


def test_readme_documents_every_flag_the_deployment_needs():
    documented = documented_flags(README)
    for role, needed in BRIEF_FLAGS.items():
        assert needed <= documented[role], needed - documented[role]
    assert documented["global"] == {"--log-level"}


def test_manifests_use_only_documented_flags(rendered):
    documented = documented_flags(README)
    calls = all_invocations(rendered)
    assert {c.role for c in calls} == set(ROLES)
    for call in calls:
        assert set(call.flags) <= documented[call.role], (call.where, set(call.flags) - documented[call.role])
        assert set(call.global_flags) <= documented["global"], call.where


def test_router_has_one_discovery_source_per_worker_role(rendered):
    for call in all_invocations(rendered):
        if call.role == "router":
            for role in ("prefill", "decode"):
                sources = {f"--{role}-workers", f"--{role}-dns"} & set(call.flags)
                assert len(sources) == 1, (call.where, sources)


def test_roles_listen_on_all_interfaces_on_their_conventional_ports(rendered):
    for call in all_invocations(rendered):
        assert call.flags["--port"] == ROLE_PORTS[call.role], call.where
        assert call.flags["--metrics-port"] == "9090", call.where
        assert call.flags["--health-port"] == "9091", call.where
        assert call.flags["--host"] == "0.0.0.0", call.where


def test_compose_router_dials_the_workers_on_their_ports():
    calls = {call.role: call for call in compose_invocations()}
    for role in ("prefill", "decode"):
        assert calls["router"].flags[f"--{role}-workers"] == f"{role}:{calls[role].flags['--port']}"
        assert calls[role].flags["--advertise-host"] == role


def cli_help(words: list[str]) -> subprocess.CompletedProcess:
    program = "import sys; from pdserve.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", program, *words, "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("role", ROLES)
def test_cli_accepts_the_documented_flags(role):
    """Every documented role is a subcommand: a missing or broken one fails here."""
    result = cli_help([role])
    assert result.returncode == 0, result.stderr
    offered = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", result.stdout))
    documented = documented_flags(README)
    assert documented[role] <= offered, documented[role] - offered
    top = cli_help([])
    assert documented["global"] <= set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", top.stdout))
