"""The C loops of layer_kernels.c (RMS norm, SwiGLU's product, rotary positions) on float32 CPU
tensors. The C code trusts the shapes and strides it is given: `norm_fits`, `silu_mul_fits` and
`rope_fits` say whether tensors are ones it was built for, and a caller checks them first
(pdserve/cpu/layer_kernels.py, which hands anything else to the torch reference).
"""

from __future__ import annotations

import ctypes

import torch

from pdserve.native.build import function_address
from pdserve.native.loader import Kernel, Loaded, load_kernel

LAYER_KERNELS = Kernel("layer_kernels.c", "native layer kernels",
                       "norms, SwiGLU and rotary positions in torch ops, slower steps")
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "pdserve_rms_norm": [_P, _I, _P, _P, _I, _I, ctypes.c_float],
    "pdserve_silu_mul": [_P, _I, _I, _I],
    "pdserve_rope": [_P, _I, _I, _I, _P, _P, _I],
}


class LayerKernelsLibrary:
    """The loaded library; each call takes tensors its `*_fits` predicate has passed."""

    def __init__(self, library: ctypes.CDLL):
        for symbol, argtypes in _SIGNATURES.items():
            function = getattr(library, symbol)
            function.argtypes, function.restype = argtypes, None
        self._lib = library

    def addresses(self) -> dict[str, int]:
        """Each C function's address, for a caller composing them in C (pdserve/cpu/fused_decode.py)."""
        names = ("rms_norm", "silu_mul", "rope")
        return {name: function_address(getattr(self._lib, f"pdserve_{name}")) for name in names}

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [T, dim] -> a fresh [T, dim]."""
        out = torch.empty(x.shape, dtype=x.dtype)
        self._lib.pdserve_rms_norm(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), x.shape[0],
                                   x.shape[1], eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """In place: the product lands in gate_up's gate half (no fresh buffer, whose pages the
        allocator would fault in again each call), which is returned."""
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        self._lib.pdserve_silu_mul(gate_up.data_ptr(), gate_up.stride(0), rows, inter)
        return gate_up[:, :inter]

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotates x [T, H, D] in place by cos/sin [T, 1, D/2]; returns x."""
        rows, heads, dim = x.shape
        self._lib.pdserve_rope(x.data_ptr(), x.stride(0), heads, dim, cos.data_ptr(), sin.data_ptr(), rows)
        return x


def norm_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return _rows_of_floats(x) and _floats(weight) and weight.is_contiguous() and weight.numel() == x.shape[1]


def silu_mul_fits(gate_up: torch.Tensor) -> bool:
    return _rows_of_floats(gate_up) and gate_up.shape[1] % 2 == 0


def rope_fits(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """x's heads contiguous and cos/sin [T, 1, D/2] tables."""
    if not (_floats(x) and _floats(cos) and _floats(sin) and x.dim() == 3):
        return False
    rows, heads, dim = x.shape
    table = (rows, 1, dim // 2)
    return (dim % 2 == 0 and x.stride(2) == 1 and x.stride(1) == dim and x.stride(0) >= heads * dim
            and tuple(cos.shape) == table and tuple(sin.shape) == table
            and cos.is_contiguous() and sin.is_contiguous())


def _floats(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.is_cpu  # is_cpu: no device object built on every call


def _rows_of_floats(x: torch.Tensor) -> bool:
    """A [T, n] float32 CPU tensor whose rows are contiguous (rows may be strided; one row's
    stride is whatever torch left it, e.g. 1 after transposing a column)."""
    return _floats(x) and x.dim() == 2 and x.stride(1) == 1 and (x.shape[0] <= 1 or x.stride(0) >= x.shape[1])


def load_layer_kernels_library() -> Loaded[LayerKernelsLibrary]:
    """The library, or None and why not (the fallback logged: loader.py)."""
    return load_kernel(LAYER_KERNELS, LayerKernelsLibrary)
