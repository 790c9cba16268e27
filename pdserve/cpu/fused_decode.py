"""A decode step through every decoder layer in one C call (pdserve/native/decode_layers.c): the
second implementation of the layers' forward pass, for the passes where the modules' Python between
the kernels is what is not reading weights or multiplying.

It serves a pass only where the modules would run exactly these kernels on these rows: every token
a decode the attention backend's C kernel attends and writes (`native_decode_pass`), at most
`max_rows` rows (PANEL_MAX_ROWS, or what the engine measured faster fused than layer by layer),
the native layer kernels on every module and float32 throughout. It calls the same C functions in
the same order on the same weights, so its output equals the modules' bit for bit where they read
the panels too (tests/cpu/test_fused_decode.py); any other pass runs the modules. At batch 1
the modules spent about 5 ms of a 26 ms step of the embedded model between the kernels, at batch
64 about 13 ms of 250 (docs/BENCHMARKS.md).

`fuse_decode(model)` attaches one where the model's layers qualify (after the weight layout and
the layer kernels are chosen); a deep copy of the model builds its own, over the copy's weights.
"""

from __future__ import annotations

import copy
import logging
import math

import torch
from torch import nn

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch
from pdserve.checkpoint.model_config import Activation, ModelConfig, NormStyle
from pdserve.cpu.layer_kernels import NativeKernels
from pdserve.kv.kv_cache import KVCache
from pdserve.model.row_route import PANEL_MAX_ROWS
from pdserve.native.decode_layers import DecodeLayers, Kernels, Layer, Pass, Shape, load_decode_layers
from pdserve.native.paged_decode import NativeDecode, NativePlan
from pdserve.native.row_panels import PanelWeight, RowPanels

log = logging.getLogger(__name__)


class FusedDecode:
    def __init__(self, library: DecodeLayers, layers: list[nn.Module], config: ModelConfig):
        """layers: the model's DecoderLayers, each on NativeKernels with every projection in panels."""
        self._library, self.layers, self.config = library, layers, config
        self._table = (Layer * len(layers))(*(_layer(layer) for layer in layers))
        self._kernels: tuple[NativeDecode, torch.dtype, Kernels] | None = None  # for the kernel and pool last seen
        self._shapes: dict[int, Shape] = {}  # by the pool's block size
        attention = layers[0].self_attn
        self._layer_kernels: NativeKernels = attention.kernels
        self._panels: RowPanels = attention.qkv_proj.streamed.kernel
        self.max_rows = PANEL_MAX_ROWS  # passes of up to this many rows (auto measures: engine/decode_probe.py)

    def __deepcopy__(self, memo: dict) -> FusedDecode:
        """A copy over the copied layers' own weights (the pointer table names the originals')."""
        twin = FusedDecode(self._library, copy.deepcopy(self.layers, memo), self.config)
        twin.max_rows = self.max_rows
        return twin

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, kv: KVCache,
                attn: AttentionBackend) -> torch.Tensor | None:
        """x [T, hidden] through every layer, updated in place and returned; None (x untouched)
        where this pass is not one the fused step serves. Called after `attn.begin(batch, kv)`."""
        native = attn.native_decode_pass() if 0 < x.shape[0] <= self.max_rows else None
        if native is None or not self._fits(x, cos, sin, kv):
            return None
        decode, plan = native
        shape = self._shape(kv)
        scratch = torch.empty(self._library.scratch_floats(shape, x.shape[0]), dtype=torch.float32)
        kernels = self._kernels_for(decode, kv.data.dtype)
        self._library.run(kernels, self._table, shape, _pass(kv, batch, plan, cos, sin), x.data_ptr(), x.shape[0],
                          scratch.data_ptr())
        return x

    def _fits(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVCache) -> bool:
        c, table = self.config, (x.shape[0], 1, self.config.head_dim // 2)
        return (x.dtype == torch.float32 and x.is_cpu and x.is_contiguous() and x.shape[1] == c.hidden_size
                and all(t.dtype == torch.float32 and t.is_contiguous() and tuple(t.shape) == table for t in (cos, sin))
                and (kv.shape.num_layers, kv.shape.num_kv_heads, kv.shape.head_dim)
                == (c.num_layers, c.num_kv_heads, c.head_dim))

    def _shape(self, kv: KVCache) -> Shape:
        if kv.block_size not in self._shapes:
            self._shapes[kv.block_size] = self._new_shape(kv)
        return self._shapes[kv.block_size]

    def _new_shape(self, kv: KVCache) -> Shape:
        c = self.config
        return Shape(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.num_layers,
                     kv.block_size, c.rms_norm_eps, 1 / math.sqrt(c.head_dim))

    def _kernels_for(self, decode: NativeDecode, pool: torch.dtype) -> Kernels:
        """The kernels' table, the attention and K/V copy those of the pool's dtype."""
        if self._kernels is None or self._kernels[:2] != (decode, pool):
            self._kernels = (decode, pool, Kernels(**self._layer_kernels.library.addresses(),
                                                   gemm=self._panels.address, **decode.addresses(pool)))
        return self._kernels[2]


def _layer(layer: nn.Module) -> Layer:
    attention, mlp = layer.self_attn, layer.mlp
    return Layer(layer.input_layernorm.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(),
                 attention.qkv_proj.streamed.panels.data_ptr(), _pointer(attention.qkv_proj.bias),
                 attention.o_proj.streamed.panels.data_ptr(), _pointer(attention.o_proj.bias),
                 mlp.gate_up_proj.streamed.panels.data_ptr(), mlp.down_proj.streamed.panels.data_ptr())


def _linears(layer: nn.Module) -> tuple[nn.Module, ...]:
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _pass(kv: KVCache, batch: ForwardBatch, plan: NativePlan, cos: torch.Tensor, sin: torch.Tensor) -> Pass:
    return Pass(kv.data.data_ptr(), batch.slot_mapping.data_ptr(), plan.tables.data_ptr(), plan.lens.data_ptr(),
                cos.data_ptr(), sin.data_ptr(), plan.tables.shape[1], plan.max_len, plan.threads,
                torch.get_num_threads())


def fusion_problem(model: nn.Module) -> str | None:
    """Why `model`'s layers cannot run fused (None: they can): Llama's layers over whole contexts
    (config_problem), no per-head q/k norms, every module on the same native kernels, every
    projection of the layers in panels, every norm, bias and panel float32 and contiguous."""
    layers = getattr(model, "layers", None)
    if not layers:
        return "the model has no decoder layers"
    config = getattr(model, "config", None)
    if config is not None and (problem := config_problem(config)):
        return problem
    if getattr(layers[0].self_attn, "q_norm", None) is not None:
        return "the layers normalise q and k per head (Qwen3), which the C step does not"
    kernels = layers[0].self_attn.kernels
    if not isinstance(kernels, NativeKernels):
        return "the layer kernels are not native (--layer-kernels torch, or not a CPU with float32)"
    for layer in layers:
        if any(m.kernels is not kernels for m in layer.modules() if hasattr(m, "kernels")):
            return "the layers' modules do not share one set of native kernels"
        linears = _linears(layer)
        if not all(isinstance(m.streamed, PanelWeight) for m in linears):
            return "the projections are not in panels (--weight-layout auto or panels, on a CPU with float32)"
        tensors = [layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                   *(m.bias for m in linears if m.bias is not None)]
        if not all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors):
            return "a norm's weight or a bias is not contiguous float32"
    return None


def config_problem(config: ModelConfig) -> str | None:
    """What of the config the C step does not compute (None: nothing): it runs Llama's layer
    (two norms, SwiGLU), every layer attending its whole context at 1 / sqrt(head_dim) with the
    one rotary table."""
    if config.layer_windows or config.local_rope_theta is not None or config.attention_scale is not None:
        return "layers attend sliding windows, with their own rotary base or score scale (Gemma 3); the C step does not"
    if config.sandwich_norms or config.norm_style is not NormStyle.LLAMA or config.activation is not Activation.SILU:
        return "the layers are Gemma 3's (four norms scaled by 1 + w, GeGLU), which the C step does not run"
    return None


def fuse_decode(model: nn.Module) -> FusedDecode | None:
    """Attaches a fused decode step to `model` (its `fused_decode`) where its layers qualify and
    the kernel builds; returns it, or None (the model's modules compute every pass, as before)."""
    model.fused_decode = None
    if problem := fusion_problem(model):
        log.info("decode steps layer by layer: %s", problem)
        return None
    library = load_decode_layers().kernel  # None: not built here (the loader says why)
    if library is not None:
        model.fused_decode = FusedDecode(library, list(model.layers), model.config)
        log.info("decode steps of up to %d rows can run every layer in one C call", model.fused_decode.max_rows)
    return model.fused_decode
