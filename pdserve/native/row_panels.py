"""Projection weights in panels, multiplied by the C kernel of row_panels.c: it reads each panel
front to back, every row of the product reusing each vector while it is in registers, and the
other rows' tiles finding the panel in the cache (pdserve/cpu/panel_weights.py says where the
panels serve).

    panels[p, i, j] = W[i, P p + j]    W: Linear.weight [in, out]; the last panel zero-padded;
                                       P: 64 columns where the kernel is built for AVX-512, else 16

Memory: the panels are a copy beside the dense weight (as a GEMM library's packing is).
"""

from __future__ import annotations

import copy
import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.native.build import function_address
from pdserve.native.loader import Kernel, Loaded, load_kernel

ROW_PANELS = Kernel("row_panels.c", "panel kernel",
                    "decode-sized products from the dense or packed weights, no fused decode step: slower decode")
_P, _I = ctypes.c_void_p, ctypes.c_int64


class RowPanels:
    """The loaded kernel: packs weights into panels and multiplies from them."""

    def __init__(self, library: ctypes.CDLL):
        self._gemm = library.pdserve_panels_gemm
        self._gemm.argtypes = [_P, _I, _I, _P, _I, _I, _P, _I]
        self._gemm.restype = None
        self._threads = library.pdserve_panels_threads
        self._threads.argtypes, self._threads.restype = [_I] * 4, _I
        width = library.pdserve_panels_width
        width.argtypes, width.restype = [], _I
        self.library_name = Path(library._name).name  # names the source, compiler, flags and CPU it was built for
        self.width = width()  # columns a panel: what this build's vector registers hold (row_panels.c)

    def __deepcopy__(self, memo: dict) -> RowPanels:
        """Stateless: a copied model shares the loaded library."""
        return self

    @property
    def address(self) -> int:
        """The C product's address, for a caller composing kernels in C (pdserve/cpu/fused_decode.py)."""
        return function_address(self._gemm)

    def threads(self, rows: int, inputs: int, outputs: int, limit: int) -> int:
        """The threads, of up to `limit`, a product of `rows` rows by an [inputs, outputs] weight runs
        on: the kernel splits one only where a thread's start pays (row_panels.c decides)."""
        return self._threads(rows, inputs, outputs, limit)

    def pack(self, weight: torch.Tensor) -> PanelWeight:
        """weight: [in, out] float32 on the CPU (Linear's layout, kept as given)."""
        dense, width = weight.detach(), self.width
        inputs, outputs = dense.shape
        count = -(-outputs // width)
        if outputs % width:  # the last panel zero-padded
            dense = torch.cat([dense, dense.new_zeros(inputs, count * width - outputs)], dim=1)
        # one copy of runs of `width` floats: [in, count, width] -> [count, in, width]
        return PanelWeight(dense.view(inputs, count, width).transpose(0, 1).contiguous(), weight, self)

    def multiply(self, x: torch.Tensor, packed: PanelWeight, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, in] float32 (rows may be strided) -> [T, out], written into `out` where given (a
        contiguous float32 [T, out] CPU tensor)."""
        inputs, outputs = packed.weight.shape
        if x.dim() != 2 or x.shape[1] != inputs or not x.is_cpu:
            raise ValueError(f"a [T, {inputs}] CPU input multiplies this weight, got {list(x.shape)} on {x.device}")
        if x.dtype != torch.float32 or x.stride(1) != 1 or (x.shape[0] > 1 and x.stride(0) < inputs):
            x = x.float().contiguous()
        if out is None:
            out = torch.empty(x.shape[0], outputs, dtype=torch.float32)
        elif (tuple(out.shape) != (x.shape[0], outputs) or out.dtype != torch.float32 or not out.is_cpu
              or not out.is_contiguous()):
            raise ValueError(f"the product goes into a contiguous float32 [{x.shape[0]}, {outputs}] CPU tensor, "
                             f"got {out.dtype} {list(out.shape)} on {out.device}")
        self._gemm(x.data_ptr(), x.stride(0), x.shape[0], packed.panels.data_ptr(), inputs, outputs,
                   out.data_ptr(), torch.get_num_threads())
        return out


@dataclass(frozen=True)
class PanelWeight:
    """One projection's weight in panels [ceil(out / P), in, P] (P: the kernel's width)."""

    panels: torch.Tensor
    weight: torch.Tensor  # [in, out], the Linear's parameter (a deep copy packs its copy)
    kernel: RowPanels

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, in] -> [T, out] (+ bias), into `out` where given (see RowPanels.multiply)."""
        y = self.kernel.multiply(x, self, out)
        return y if bias is None else y.add_(bias)

    def __deepcopy__(self, memo: dict) -> PanelWeight:
        return self.kernel.pack(copy.deepcopy(self.weight, memo))

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


def load_row_panels_kernel() -> Loaded[RowPanels]:
    """The kernel, or None and why not (the fallback logged: loader.py)."""
    return load_kernel(ROW_PANELS, RowPanels)
