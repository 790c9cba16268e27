"""Slow workers by construction: each engine step of a paced worker waits a set time first (the
fault file's `pace <seconds>`, pdserve/engine/faults.py), so a stream lasts long enough for a test
to act on it however fast this machine decodes, while the worker spends almost no CPU."""

from __future__ import annotations

from collections.abc import Iterable

from pdserve.engine.faults import INJECT_ENV
from pdserve.procs.supervisor import Child, Supervisor

EMBEDDED_STEP_S = 0.05  # about the embedded model's decode step on one thread of this class of machine


def tiny_model(tmp_path_factory, name: str, max_positions: int = 512) -> str:
    """A tiny random model's folder for a paced fleet (tests/helpers/tiny_models.py's tiny_qwen2_bias)."""
    from tests.helpers.tiny_models import tiny_qwen2_bias

    return str(tiny_qwen2_bias(tmp_path_factory.mktemp(name) / "qwen2", max_positions=max_positions))


def allow_pacing(sup: Supervisor) -> None:
    """Workers spawned from now on read their fault file (one per process) in `sup`'s workdir."""
    sup.env[INJECT_ENV] = str(sup.workdir / "inject-{pid}")


def pace(sup: Supervisor, worker: Child, step_s: float) -> None:
    """Every engine step of `worker` from its next one waits `step_s` first (0: no more)."""
    (sup.workdir / f"inject-{worker.process.pid}").write_text(f"pace {step_s}")


def pace_all(sup: Supervisor, workers: Iterable[Child], step_s: float = EMBEDDED_STEP_S) -> None:
    for worker in workers:
        pace(sup, worker, step_s)


def greedy_outputs(model: str, prompts: list, max_tokens: int) -> list[tuple[int, ...]]:
    """The prompts' greedy outputs (EOS ignored): see engine_outputs."""
    from pdserve.requests import SamplingParams

    return engine_outputs(model, prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


def engine_outputs(model: str, prompts: list, sampling) -> list[tuple[int, ...]]:
    """The prompts' outputs from one in-process engine on `model`, in one batch: the references of a
    paced tiny-model fleet (that engine is checked against transformers elsewhere)."""
    from pdserve.config import CacheConfig, EngineConfig
    from pdserve.engine.llm import LLM

    llm = LLM(EngineConfig(model=model, cache=CacheConfig(num_blocks=512)))
    try:
        return [tuple(c.token_ids) for c in llm.generate(list(prompts), sampling)]
    finally:
        llm.close()
