"""What the model code needs to know about a checkpoint, read once from config.json
(hf_config.py) or GGUF metadata (gguf_config.py).

NOTE: sliding-window models (Mistral) are run with full attention and their usable context capped
to the window: within the window the two are identical, so `max_position_embeddings` is
min(max positions, window) and `sliding_window` keeps the original value for reference.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pdserve.checkpoint.errors import ModelLoadError
from pdserve.checkpoint.rope_scaling import RopeScaling
from pdserve.kv.kv_shape import KVShape


class Architecture(str, enum.Enum):
    LLAMA = "LlamaForCausalLM"
    MISTRAL = "MistralForCausalLM"
    QWEN2 = "Qwen2ForCausalLM"
    QWEN3 = "Qwen3ForCausalLM"


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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"{self.name}: {self.num_heads} heads not divisible by {self.num_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ModelLoadError(f"{self.name}: head_dim {self.head_dim} must be even for rotary embedding")

    @property
    def qk_norm(self) -> bool:
        """q and k RMS-normalised per head (weights [head_dim]) before the rotation: Qwen3's."""
        return self.architecture is Architecture.QWEN3

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_shape(self, block_size: int) -> KVShape:
        return KVShape(self.num_layers, self.num_kv_heads, self.head_dim, block_size)
