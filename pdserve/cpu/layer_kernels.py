"""Which implementation of the layer's small ops (pdserve/model/layer_kernels.py) a model runs:
a pure choice from the name asked for and what stops the native kernels here.

    torch:  torch ops (the reference; every device and dtype)
    native: one C pass over each row (CPU float32; pdserve/native/layer_kernels.c), where torch
            runs four to six ops with a fresh buffer each: the norms and rotary products of a
            batch-64 decode step of the embedded model took 11.8 ms in torch, 6.0 in C
            (docs/BENCHMARKS.md)
    auto:   native where nothing stops it, else torch

`NativeKernels` calls the C loops only on tensors they were built for (their `*_fits` checks); any
other (another dtype or device, elements not contiguous) goes to the torch reference, so a call is
never wrong, only slower.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from pdserve.config import LAYER_KERNELS
from pdserve.model.layer_kernels import LayerKernels, TorchKernels
from pdserve.native.layer_kernels import (LayerKernelsLibrary, load_layer_kernels_library, norm_fits, rope_fits,
                                          silu_mul_fits)
from pdserve.native.loader import Loaded

log = logging.getLogger(__name__)


class LayerKernelsUnavailable(RuntimeError):
    """The native kernels asked for where they cannot run (not a CPU, not float32, no compiler)."""


class NativeKernels:
    name = "native"

    def __init__(self, library: LayerKernelsLibrary):
        self.library = library
        self._reference = TorchKernels()

    def __deepcopy__(self, memo: dict) -> NativeKernels:
        """Stateless: a copied model shares the loaded library."""
        return self

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not norm_fits(x, weight):
            return self._reference.rms_norm(x, weight, eps)
        return self.library.rms_norm(x, weight, eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """In place, as the reference."""
        if not silu_mul_fits(gate_up):
            return self._reference.silu_mul(gate_up)
        return self.library.silu_mul(gate_up)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The torch reference's (no C loop for GeGLU yet)."""
        return self._reference.gelu_tanh_mul(gate_up)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates x in place where x's heads are contiguous and cos/sin are [T, 1, D/2] tables."""
        if not rope_fits(x, cos, sin):
            return self._reference.rope(x, cos, sin)
        return self.library.rope(x, cos, sin)


def load_native_kernels(device: str | torch.device, dtype: torch.dtype) -> Loaded[NativeKernels]:
    """The kernels for a model on `device` in `dtype`, or None and why not."""
    if torch.device(device).type != "cpu":
        return Loaded(None, f"device {device} is not a CPU")
    if dtype != torch.float32:
        return Loaded(None, f"they compute float32, not {dtype}")
    library, problem = load_layer_kernels_library()
    return Loaded(None if library is None else NativeKernels(library), problem)


def choose_layer_kernels(name: str, problem: str | None) -> str:
    """`problem`: why the native kernels cannot run here (None: they can). Raises ValueError for an
    unknown name, LayerKernelsUnavailable for `native` with a problem."""
    if name not in LAYER_KERNELS:
        raise ValueError(f"unknown layer kernels {name!r}; choose one of {', '.join(LAYER_KERNELS)}")
    if name == "auto":
        return "torch" if problem else "native"
    if name == "native" and problem:
        raise LayerKernelsUnavailable(f"native layer kernels unavailable: {problem}; use --layer-kernels torch")
    return name


def apply_layer_kernels(model: nn.Module, name: str, device: str | torch.device, dtype: torch.dtype) -> str:
    """Sets the kernels every module of `model` computes its small ops with; returns which."""
    native, problem = load_native_kernels(device, dtype) if name != "torch" else (None, None)
    chosen = choose_layer_kernels(name, problem)
    if chosen == "native":
        set_layer_kernels(model, native)
        log.info("layer kernels: native (norms, SwiGLU, rotary positions in pdserve/native/layer_kernels.c)")
    return chosen


def set_layer_kernels(model: nn.Module, kernels: LayerKernels) -> int:
    """Points every module that has small ops at `kernels`; returns how many."""
    modules = [m for m in model.modules() if hasattr(m, "kernels")]
    for module in modules:
        module.kernels = kernels
    return len(modules)
