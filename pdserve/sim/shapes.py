"""Decoder-only transformer shapes (Llama family: GQA attention, gated MLP) and their arithmetic.

Counting conventions, per layer:

    attention  q: hidden x (heads * head_dim)      k, v: hidden x (kv_heads * head_dim) each
               o: (heads * head_dim) x hidden
    mlp        gate, up: hidden x intermediate     down: intermediate x hidden
    norms      2 x hidden

plus the input embedding (vocab x hidden, a gather: no FLOPs, only touched rows are read), a
final norm and the lm_head (vocab x hidden; shared with the embedding when tied). A matmul
costs 2 FLOPs per weight per token; the lm_head runs only for tokens that are sampled.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    bytes_per_param: float
    bytes_per_kv_elem: float
    tied_embeddings: bool = False
    bytes_per_activation: float = 2.0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: {self.num_heads} heads not a multiple of {self.num_kv_heads} KV heads")

    def layer_matmul_params(self) -> int:
        q_and_o = 2 * self.hidden * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v + 3 * self.hidden * self.intermediate

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        """All parameters: layers, norms, embedding, and the lm_head unless tied."""
        layer = self.layer_matmul_params() + 2 * self.hidden
        heads = (1 if self.tied_embeddings else 2) * self.embedding_params()
        return self.num_layers * layer + self.hidden + heads

    def weight_bytes(self) -> float:
        return self.params() * self.bytes_per_param

    def streamed_weight_bytes(self) -> float:
        """Bytes a forward step must read: every weight but an untied input embedding table."""
        gathered = 0 if self.tied_embeddings else self.embedding_params()
        return (self.params() - gathered) * self.bytes_per_param

    def kv_bytes_per_token(self) -> float:
        """K and V of one token over all layers: layers x 2 x kv_heads x head_dim x bytes."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.bytes_per_kv_elem

    def kv_block_bytes(self, block_size: int) -> float:
        return block_size * self.kv_bytes_per_token()

    def linear_flops_per_token(self) -> float:
        """2 x matmul weights of all layers (lm_head excluded: see `lm_head_flops`)."""
        return 2.0 * self.num_layers * self.layer_matmul_params()

    def lm_head_flops(self) -> float:
        """FLOPs of the logits of one sampled token."""
        return 2.0 * self.embedding_params()

    def linear_flops(self, tokens: int, sampled: int) -> float:
        return tokens * self.linear_flops_per_token() + sampled * self.lm_head_flops()

    def attention_flops_per_position(self) -> float:
        """QK^T and PV, 2 FLOPs each per (query, attended key) pair per head dim, all layers."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim

    def attention_flops(self, query_tokens: int, context_len: int) -> float:
        """Causal attention of `query_tokens` queries ending at position `context_len`.

        Query i (1-based position p = context_len - query_tokens + i) attends p keys, so
        sum_p p = q*c - q*(q-1)/2  (q = query_tokens, c = context_len).
        """
        return self.attention_flops_per_position() * attended_positions(query_tokens, context_len)


def attended_positions(query_tokens: int, context_len: int) -> int:
    """Sum over the chunk's queries of how many keys each attends (closed form, causal)."""
    if not 0 <= query_tokens <= context_len:
        raise ValueError(f"need 0 <= query_tokens <= context_len, got {query_tokens}, {context_len}")
    return query_tokens * context_len - query_tokens * (query_tokens - 1) // 2


def llama31_8b() -> ModelShape:
    return ModelShape(
        name="llama-3.1-8b", num_layers=32, hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate=14336, vocab=128256, bytes_per_param=2, bytes_per_kv_elem=2,
    )


def llama31_70b() -> ModelShape:
    return ModelShape(
        name="llama-3.1-70b", num_layers=80, hidden=8192, num_heads=64, num_kv_heads=8, head_dim=128,
        intermediate=28672, vocab=128256, bytes_per_param=2, bytes_per_kv_elem=2,
    )


def smollm2_135m() -> ModelShape:
    """The embedded model as the CPU engine runs it: dequantized to fp32."""
    return ModelShape(
        name="smollm2-135m", num_layers=30, hidden=576, num_heads=9, num_kv_heads=3, head_dim=64,
        intermediate=1536, vocab=49152, bytes_per_param=4, bytes_per_kv_elem=4,
        tied_embeddings=True, bytes_per_activation=4,
    )


def model_shapes() -> dict[str, ModelShape]:
    """Every built-in shape by name (a fresh dict each call)."""
    return {s.name: s for s in (llama31_8b(), llama31_70b(), smollm2_135m())}


def get_shape(name: str) -> ModelShape:
    shapes = model_shapes()
    if name not in shapes:
        raise KeyError(f"unknown model shape {name!r}; known: {sorted(shapes)}")
    return shapes[name]
