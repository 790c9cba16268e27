"""The native implementation of LayerKernels (pdserve/model/layer_kernels.py): the C loops of
layer_kernels.c, built with the machine's C compiler at first use (pdserve/attention/native_build.py)
and called on float32 CPU tensors. Every shape and stride the C code relies on is checked here;
a tensor it was not built for (another dtype or device, elements not contiguous) goes to the torch
reference instead, so a call is never wrong, only slower.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from pdserve.attention.native_build import NativeBuildError, function_address, load_library
from pdserve.model.layer_kernels import TorchKernels

SOURCE = Path(__file__).with_name("layer_kernels.c")
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "pdserve_rms_norm": [_P, _I, _P, _P, _I, _I, ctypes.c_float],
    "pdserve_silu_mul": [_P, _I, _I, _I],
    "pdserve_rope": [_P, _I, _I, _I, _P, _P, _I],
}


class NativeKernels:
    name = "native"

    def __init__(self, library: ctypes.CDLL):
        for symbol, argtypes in _SIGNATURES.items():
            function = getattr(library, symbol)
            function.argtypes, function.restype = argtypes, None
        self._lib = library
        self._reference = TorchKernels()

    def __deepcopy__(self, memo: dict) -> NativeKernels:
        """Stateless: a copied model shares the loaded library."""
        return self

    @classmethod
    def load(cls) -> NativeKernels:
        """Raises NativeBuildError when the kernels cannot be built or loaded here."""
        return cls(load_library(SOURCE))

    def addresses(self) -> dict[str, int]:
        """Each C function's address, for a caller composing them in C (fused_decode.py)."""
        names = ("rms_norm", "silu_mul", "rope")
        return {name: function_address(getattr(self._lib, f"pdserve_{name}")) for name in names}

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not (_rows_of_floats(x) and _floats(weight) and weight.is_contiguous() and weight.numel() == x.shape[1]):
            return self._reference.rms_norm(x, weight, eps)
        out = torch.empty(x.shape, dtype=x.dtype)
        self._lib.pdserve_rms_norm(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), x.shape[0],
                                   x.shape[1], eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """In place, as the reference: the product lands in gate_up's gate half (no fresh buffer,
        whose pages the allocator would fault in again each call)."""
        if not _rows_of_floats(gate_up) or gate_up.shape[1] % 2:
            return self._reference.silu_mul(gate_up)
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        self._lib.pdserve_silu_mul(gate_up.data_ptr(), gate_up.stride(0), rows, inter)
        return gate_up[:, :inter]

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates x in place where x's heads are contiguous and cos/sin are [T, 1, D/2] tables."""
        if not _rope_fits(x, cos, sin):
            return self._reference.rope(x, cos, sin)
        rows, heads, dim = x.shape
        self._lib.pdserve_rope(x.data_ptr(), x.stride(0), heads, dim, cos.data_ptr(), sin.data_ptr(), rows)
        return x


def _floats(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.is_cpu  # is_cpu: no device object built on every call


def _rows_of_floats(x: torch.Tensor) -> bool:
    """A [T, n] float32 CPU tensor whose rows are contiguous (rows may be strided; one row's
    stride is whatever torch left it, e.g. 1 after transposing a column)."""
    return _floats(x) and x.dim() == 2 and x.stride(1) == 1 and (x.shape[0] <= 1 or x.stride(0) >= x.shape[1])


def _rope_fits(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    if not (_floats(x) and _floats(cos) and _floats(sin) and x.dim() == 3):
        return False
    rows, heads, dim = x.shape
    table = (rows, 1, dim // 2)
    return (dim % 2 == 0 and x.stride(2) == 1 and x.stride(1) == dim and x.stride(0) >= heads * dim
            and tuple(cos.shape) == table and tuple(sin.shape) == table
            and cos.is_contiguous() and sin.is_contiguous())


def load_native_kernels(device: str | torch.device, dtype: torch.dtype) -> tuple[NativeKernels | None, str | None]:
    """The kernels for a model on `device` in `dtype`, or None and why not."""
    if torch.device(device).type != "cpu":
        return None, f"device {device} is not a CPU"
    if dtype != torch.float32:
        return None, f"they compute float32, not {dtype}"
    try:
        return NativeKernels.load(), None
    except NativeBuildError as exc:
        return None, str(exc)
