"""The C call of decode_layers.c: a decode step through every decoder layer, composing the other
kernels of this folder by their addresses (pdserve/cpu/fused_decode.py says when it serves).

Every pointer it is given is trusted: the structures below mirror decode_layers.c's, and the
caller fills them from tensors it has checked.
"""

from __future__ import annotations

import ctypes

from pdserve.native.loader import Kernel, Loaded, load_kernel

DECODE_LAYERS = Kernel("decode_layers.c", "fused decode kernel", "decode steps run layer by layer, slower decode")
_P, _I = ctypes.c_void_p, ctypes.c_int64


class Kernels(ctypes.Structure):
    """The C functions a step calls (their addresses)."""

    _fields_ = [(name, _P) for name in ("rms_norm", "silu_mul", "rope", "gemm", "write_kv", "attend")]


class Layer(ctypes.Structure):
    """One layer's norms, panels and biases (NULL: none)."""

    _fields_ = [(name, _P) for name in ("input_norm", "post_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up",
                                        "down")]


class Shape(ctypes.Structure):
    _fields_ = [(name, _I) for name in ("hidden", "heads", "kv_heads", "head_dim", "inter", "num_layers",
                                        "block_size")] + [(name, ctypes.c_float) for name in ("eps", "scale")]


class Pass(ctypes.Structure):
    """One step's pool, slots, block tables, context lengths and rotary tables."""

    _fields_ = [(name, _P) for name in ("pool", "slots", "tables", "lens", "cos", "sin")] + [
        (name, _I) for name in ("table_stride", "max_len", "attend_threads", "threads")]


class DecodeLayers:
    """The loaded library."""

    def __init__(self, library: ctypes.CDLL):
        self._run = library.pdserve_decode_layers
        self._run.argtypes, self._run.restype = [_P] * 5 + [_I, _P], ctypes.c_int
        self._scratch = library.pdserve_decode_scratch_floats
        self._scratch.argtypes, self._scratch.restype = [_P, _I], _I

    def __deepcopy__(self, memo: dict) -> DecodeLayers:
        """Stateless: a copied model shares the loaded library."""
        return self

    def scratch_floats(self, shape: Shape, rows: int) -> int:
        """The floats of scratch a step of `rows` rows needs."""
        return self._scratch(ctypes.byref(shape), rows)

    def run(self, kernels: Kernels, layers: ctypes.Array, shape: Shape, one_pass: Pass, x: int, rows: int,
            scratch: int) -> None:
        """x: the address of [rows, hidden] float32, updated in place through every layer of
        `layers`; scratch: the address of `scratch_floats(shape, rows)` floats."""
        if self._run(ctypes.byref(kernels), layers, ctypes.byref(shape), ctypes.byref(one_pass), x, rows,
                     scratch) != 0:
            raise MemoryError("the decode attention kernel could not allocate its scratch or threads")


def load_decode_layers() -> Loaded[DecodeLayers]:
    """The library, or None and why not (the fallback logged: loader.py)."""
    return load_kernel(DECODE_LAYERS, DecodeLayers)
