"""Tiny random-weight checkpoints saved with transformers, each with a working tokenizer.

Every builder writes a complete model folder (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json with a ChatML template, generation_config.json) and returns its path.
Everything is seeded: the same call writes the same weights and the same tokenizer.

Weights are drawn wider than transformers' default initialisation (std 0.02 would make every
logit nearly equal): greedy decoding then has clear winners and parity tests are not decided by
rounding. Biases, which transformers initialises to zero, are filled with random values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
BOS_ID, EOS_ID = 1, 2
VOCAB_SIZE = 384
GEMMA3_WINDOW = 10  # tokens of tiny_gemma3's sliding window; not a multiple of the tests' block sizes
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Tiny models speak in random tokens, but their tokenizers must still work end to end.",
    "Once upon a time, a scheduler split long prompts into chunks and served everyone.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000; symbols: !?.,;:-_()[]{}<>/\\'\"",
    "user\nassistant\nsystem\nHello! How are you today? I am fine, thank you.",
]


def build_tokenizer(folder: Path) -> None:
    """A byte-level BPE trained on a fixed corpus, saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=SPECIAL_TOKENS[BOS_ID],
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[0],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(str(folder))


def _common(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=0.15,
    )
    base.update(overrides)
    return base


def _save(folder: Path, config, model_class, seed: int) -> Path:
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.5)
            elif "norm" in name:
                param.uniform_(0.5, 1.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    build_tokenizer(folder)
    return folder


def tiny_llama_gqa_llama3(folder: Path, seed: int = 0) -> Path:
    """Llama, 4 query heads over 2 KV heads, llama3 rope scaling with all three frequency bands
    (original context 64 tokens), tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    config = LlamaConfig(**_common(rope_parameters=rope, tie_word_embeddings=True))
    return _save(folder, config, LlamaForCausalLM, seed)


def tiny_qwen2_bias(folder: Path, seed: int = 1, max_positions: int = 512) -> Path:
    """Qwen2: q/k/v projections with (random) biases, tied embeddings, rope theta 1e6."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    rope = {"rope_type": "default", "rope_theta": 1e6}
    config = Qwen2Config(**_common(rope_parameters=rope, tie_word_embeddings=True,
                                   max_position_embeddings=max_positions))
    return _save(folder, config, Qwen2ForCausalLM, seed)


def tiny_llama_untied(folder: Path, seed: int = 2) -> Path:
    """Llama with a separate lm_head, plain multi-head attention (as many KV heads as heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**_common(num_key_value_heads=4, num_hidden_layers=3, tie_word_embeddings=False))
    return _save(folder, config, LlamaForCausalLM, seed)


def tiny_mistral(folder: Path, seed: int = 3) -> Path:
    """Mistral: head_dim 32 (heads x head_dim != hidden), 4 heads over 1 KV head, sliding window
    128 below 1024 max positions (this project caps the context to the window)."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        **_common(num_key_value_heads=1, head_dim=32, sliding_window=128, max_position_embeddings=1024)
    )
    return _save(folder, config, MistralForCausalLM, seed)


def tiny_qwen3(folder: Path, seed: int = 4) -> Path:
    """Qwen3: per-head q/k norms (random weights), no q/k/v bias, head_dim 32 (heads x head_dim !=
    hidden), 4 query heads over 2 KV heads, a separate lm_head, rope theta 1e6."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    rope = {"rope_type": "default", "rope_theta": 1e6}
    config = Qwen3Config(**_common(head_dim=32, rope_parameters=rope, tie_word_embeddings=False))
    return _save(folder, config, Qwen3ForCausalLM, seed)


def tiny_gemma3(folder: Path, seed: int = 5, query_pre_attn_scalar: int = 24, max_positions: int = 512) -> Path:
    """Gemma 3: 7 layers in transformers' default pattern (5 with a sliding window of GEMMA3_WINDOW
    tokens, one global, one more windowed), local rope base 10000 and global 1e6 with linear
    scaling (factor 4) on the global layer only, four (1 + w) norms a layer with random weights,
    per-head q/k norms, GeGLU, head_dim 32 over 4 query and 2 KV heads, scores scaled by
    `query_pre_attn_scalar` ** -0.5 (32, head_dim, is what a GGUF file can say), embeddings
    scaled by sqrt(hidden), tied; `max_positions` positions. Not in TINY_MODELS: its tests build it
    themselves."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    rope = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    config = Gemma3TextConfig(**_common(head_dim=32, num_hidden_layers=7, sliding_window=GEMMA3_WINDOW,
                                        query_pre_attn_scalar=query_pre_attn_scalar, rope_parameters=rope,
                                        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                                        pad_token_id=0, max_position_embeddings=max_positions))
    return _save(folder, config, Gemma3ForCausalLM, seed)


TINY_MODELS: dict[str, Callable[[Path], Path]] = {
    "llama_gqa_llama3": tiny_llama_gqa_llama3,
    "qwen2_bias": tiny_qwen2_bias,
    "llama_untied": tiny_llama_untied,
    "mistral": tiny_mistral,
    "qwen3": tiny_qwen3,
}


def build_all(root: Path) -> dict[str, Path]:
    return {name: builder(root / name) for name, builder in TINY_MODELS.items()}
