"""What the model code needs to know about a checkpoint, read once from config.json
(hf_config.py) or GGUF metadata (gguf_config.py).

NOTE: models whose every layer has one sliding window (Mistral, Qwen2 with use_sliding_window) are
run with full attention and their usable context capped to the window: within the window the two
are identical, so `max_position_embeddings` is min(max positions, window) and `sliding_window` keeps
the original value for reference. Per-layer windows (Gemma 3's local layers, `layer_windows`) are
honoured by the attention backends, each query seeing at most the last `window` positions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.rope_scaling import RopeScaling
from pdserve.kv.kv_shape import KVShape
from pdserve.kv.page_groups import PageGroups


class Architecture(str, enum.Enum):
    LLAMA = "LlamaForCausalLM"
    MISTRAL = "MistralForCausalLM"
    QWEN2 = "Qwen2ForCausalLM"
    QWEN3 = "Qwen3ForCausalLM"
    GEMMA3 = "Gemma3ForCausalLM"


class NormStyle(str, enum.Enum):
    """How an RMS norm's learned weight w scales the normalised x (x_hat, computed in float32)."""

    LLAMA = "llama"  # x_hat cast to the model's dtype, times w
    GEMMA = "gemma"  # x_hat * (1 + w) in float32, then cast (w is stored as trained: around 0)


class Activation(str, enum.Enum):
    """The gate's nonlinearity in the gated MLP down(act(gate(x)) * up(x))."""

    SILU = "silu"  # SwiGLU
    GELU_TANH = "gelu_tanh"  # GeGLU with gelu's tanh approximation (transformers' gelu_pytorch_tanh)


@dataclass(frozen=True)
class ModelConfig:
    architecture: Architecture
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    name: str
    o_proj_bias: bool = False  # Llama with attention_bias=true also biases o_proj
    sliding_window: int | None = None
    norm_style: NormStyle = NormStyle.LLAMA
    activation: Activation = Activation.SILU
    embedding_scale: float | None = None  # embeddings times this, in the model's dtype (Gemma: sqrt(hidden))
    attention_scale: float | None = None  # q.k scaled by this; None: 1 / sqrt(head_dim)
    layer_windows: tuple[int | None, ...] = ()  # per layer: positions each query sees (None: all); (): all, all
    local_rope_theta: float | None = None  # rotary base of the windowed layers, unscaled; None: `rope_theta`'s
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"{self.name}: {self.num_heads} heads not divisible by {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ModelLoadError(f"{self.name}: head_dim {self.head_dim} must be even for rotary embedding")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelLoadError(f"{self.name}: {len(self.layer_windows)} layer windows for {self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ModelLoadError(f"{self.name}: an attention window must hold at least one position")

    @property
    def qk_norm(self) -> bool:
        """q and k RMS-normalised per head (weights [head_dim]) before the rotation: Qwen3's, Gemma 3's."""
        return self.architecture in (Architecture.QWEN3, Architecture.GEMMA3)

    @property
    def sandwich_norms(self) -> bool:
        """Each block's output normalised too before the residual add (Gemma 3: four norms a layer)."""
        return self.architecture is Architecture.GEMMA3

    def window(self, layer: int) -> int | None:
        """The positions a query of `layer` sees, itself included (None: every earlier one)."""
        return self.layer_windows[layer] if self.layer_windows else None

    def local_rope(self, layer: int) -> bool:
        """`layer` rotates with `local_rope_theta` (a windowed layer of a model that has one)."""
        return self.local_rope_theta is not None and self.window(layer) is not None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def page_groups(self) -> PageGroups:
        """The layer groups of its KV pages (one group unless its layers' windows differ)."""
        return PageGroups.of(self.layer_windows) if self.layer_windows else PageGroups.single(self.num_layers)

    def kv_shape(self, block_size: int) -> KVShape:
        """One block of its KV: every layer (a pool of layer groups holds pages of fewer: KVCache)."""
        return KVShape(self.num_layers, self.num_kv_heads, self.head_dim, block_size)
