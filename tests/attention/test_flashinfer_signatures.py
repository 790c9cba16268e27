"""Every call the flashinfer backend makes fits flashinfer's signatures: those of the version
pyproject.toml's gpu extra names as its floor (a table written here, read from that release's
source), and those of the installed flashinfer when it imports. No kernel runs: the calls are
collected by running the backend on CPU against a recording stand-in for the module."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from tests.attention.recording_flashinfer import Call, RecordingFlashInfer
from tests.attention.test_attention_torch import LAYERS, Case, build

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
FLOOR = "0.2.1"  # flashinfer-python: the first release whose plan() takes head_dim_qk (0.2.0 named it head_dim)


class Params(NamedTuple):
    """A callable's parameters, self left out: positional-or-keyword names in order, how many of
    them are required, keyword-only names, whether it takes *args."""

    names: tuple[str, ...]
    required: int
    keyword_only: tuple[str, ...] = ()
    var_positional: bool = False

    def signature(self) -> inspect.Signature:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        optional = {"default": None}
        params = [inspect.Parameter(n, kind, **({} if i < self.required else optional)) for i, n in enumerate(self.names)]
        if self.var_positional:
            params.append(inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL))
        params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in self.keyword_only]
        return inspect.Signature(params)


PLAN_ARGS = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
             "num_kv_heads")
PLAN_OPTIONS = ("custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode", "use_fp16_qk_reduction",
                "sm_scale", "window_left", "logits_soft_cap", "rope_scale", "rope_theta", "q_data_type",
                "kv_data_type", "non_blocking")
WRAPPER = "BatchPrefillWithPagedKVCacheWrapper"
FLOOR_PARAMS = {  # flashinfer/prefill.py at v0.2.1
    WRAPPER: Params(("float_workspace_buffer", "kv_layout", "use_cuda_graph", "qo_indptr_buf", "paged_kv_indptr_buf",
                     "paged_kv_indices_buf", "paged_kv_last_page_len_buf", "custom_mask_buf", "mask_indptr_buf",
                     "backend", "jit_args"), required=1),
    f"{WRAPPER}.plan": Params((*PLAN_ARGS, "head_dim_qk", "page_size", "head_dim_vo", *PLAN_OPTIONS), required=8),
    f"{WRAPPER}.run": Params(("q", "paged_kv_cache"), required=2, keyword_only=("k_scale", "v_scale", "return_lse"),
                             var_positional=True),
}
BEFORE_FLOOR_PLAN = Params((*PLAN_ARGS, "head_dim", "page_size", *PLAN_OPTIONS), required=8)  # v0.2.0.post2


@pytest.fixture(scope="module")
def backend_calls() -> list[Call]:
    """What one pass of two layers over a mixed batch calls in flashinfer."""
    recorder = RecordingFlashInfer()
    saved = sys.modules.get("flashinfer")
    sys.modules["flashinfer"] = recorder
    try:
        _one_pass()
    finally:
        if saved is None:
            del sys.modules["flashinfer"]
        else:
            sys.modules["flashinfer"] = saved
    return recorder.calls


def _one_pass() -> None:
    from pdserve.attention.flashinfer_backend import FlashInferBackend

    kv, batch, q, _, _ = build([Case(0, 5), Case(6, 1)], 4, 2, 16, 4, seed=0)
    kv.data = kv.data.to(torch.bfloat16)
    backend = FlashInferBackend("cpu")
    backend.begin(batch, kv)
    for layer in range(LAYERS):
        k = torch.zeros(batch.num_tokens, 2, 16, dtype=torch.bfloat16)
        backend.forward(layer, q[layer].bfloat16(), k, k.clone(), kv)


def test_the_backend_constructs_plans_and_runs_the_paged_wrapper(backend_calls):
    assert [c.target for c in backend_calls] == [WRAPPER, f"{WRAPPER}.plan"] + [f"{WRAPPER}.run"] * LAYERS


def test_every_call_fits_the_floor_version(backend_calls):
    for call in backend_calls:
        FLOOR_PARAMS[call.target].signature().bind(*call.args, **call.kwargs)


def test_the_release_before_the_floor_refuses_the_plan_call(backend_calls):
    [plan] = [c for c in backend_calls if c.target == f"{WRAPPER}.plan"]
    assert "head_dim_qk" in plan.kwargs
    with pytest.raises(TypeError, match="head_dim"):
        BEFORE_FLOOR_PLAN.signature().bind(*plan.args, **plan.kwargs)


def test_the_gpu_extra_names_the_floor():
    extra = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]
    [flashinfer] = [r for r in extra if r.startswith("flashinfer-python")]
    assert re.fullmatch(r"flashinfer-python>=([0-9.]+)(,.*)?", flashinfer).group(1) == FLOOR


def installed_flashinfer():
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer is not installed (pip install 'pdserve[gpu]' on a CUDA machine)")
    try:
        import flashinfer
    except (ImportError, OSError, RuntimeError) as exc:
        pytest.skip(f"flashinfer is installed but does not import here: {exc}")
    return flashinfer


def installed_signature(flashinfer, target: str) -> inspect.Signature:
    owner, _, method = target.partition(".")
    if not method:
        return inspect.signature(getattr(flashinfer, owner))
    signature = inspect.signature(getattr(getattr(flashinfer, owner), method))
    return signature.replace(parameters=list(signature.parameters.values())[1:])  # self


def test_every_call_fits_the_installed_flashinfer(backend_calls):
    flashinfer = installed_flashinfer()
    version = getattr(flashinfer, "__version__", "of unknown version")
    for call in backend_calls:
        try:
            installed_signature(flashinfer, call.target).bind(*call.args, **call.kwargs)
        except TypeError as exc:
            pytest.fail(f"flashinfer {version}: {call.target}{tuple(call.kwargs)}: {exc}")
