"""config.json and GGUF metadata -> ModelConfig."""

from __future__ import annotations

import pytest

from pdserve.kv.kv_shape import KVShape
from pdserve.checkpoint.errors import ModelLoadError, UnsupportedModelError
from pdserve.checkpoint.hf_config import config_from_hf
from pdserve.checkpoint.model_config import Architecture
from pdserve.checkpoint.rope_scaling import Llama3RopeScaling, LinearRopeScaling, NoRopeScaling


def llama_json(**overrides):
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    raw.update(overrides)
    return raw


def test_llama_defaults_and_derived_sizes():
    config = config_from_hf(llama_json(), name="m")
    assert config.architecture is Architecture.LLAMA
    assert (config.head_dim, config.q_size, config.kv_size) == (32, 256, 64)
    assert config.rope_theta == 10000.0 and config.rope_scaling == NoRopeScaling()
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1
    assert not config.tie_word_embeddings and not config.attention_bias and not config.o_proj_bias
    assert config.kv_shape(16) == KVShape(num_layers=4, num_kv_heads=2, head_dim=32, block_size=16)


def test_llama3_scaling_in_the_current_rope_parameters_form():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    config = config_from_hf(llama_json(rope_parameters=rope), name="m")
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)


def test_scaling_in_the_older_rope_scaling_form():
    config = config_from_hf(llama_json(rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0}), name="m")
    assert config.rope_theta == 1e6 and config.rope_scaling == LinearRopeScaling(2.0)


def test_unsupported_rope_scaling_is_named():
    with pytest.raises(UnsupportedModelError, match="rope scaling 'yarn'"):
        config_from_hf(llama_json(rope_scaling={"rope_type": "yarn", "factor": 4.0}), name="m")


def test_qwen2_has_qkv_bias_and_no_output_bias():
    config = config_from_hf(llama_json(architectures=["Qwen2ForCausalLM"], sliding_window=4096), name="q")
    assert config.attention_bias and not config.o_proj_bias
    assert config.max_position_embeddings == 2048 and config.sliding_window is None


def test_qwen3_normalises_q_and_k_per_head_and_has_its_own_head_dim():
    config = config_from_hf(llama_json(architectures=["Qwen3ForCausalLM"], head_dim=128), name="q3")
    assert config.architecture is Architecture.QWEN3 and config.qk_norm
    assert (config.head_dim, config.q_size, config.kv_size) == (128, 1024, 256)
    assert not config.attention_bias and not config.o_proj_bias
    assert config.kv_shape(16) == KVShape(num_layers=4, num_kv_heads=2, head_dim=128, block_size=16)
    biased = config_from_hf(llama_json(architectures=["Qwen3ForCausalLM"], attention_bias=True), name="q3")
    assert biased.attention_bias and biased.o_proj_bias  # transformers biases o_proj with them
    assert not config_from_hf(llama_json(architectures=["Qwen2ForCausalLM"]), name="q2").qk_norm


@pytest.mark.parametrize("name", ["Qwen3MoeForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM"])
def test_an_architecture_not_run_here_is_named(name):
    with pytest.raises(UnsupportedModelError, match=f"unsupported architecture {name}; supported: "):
        config_from_hf(llama_json(architectures=[name]), name="m")


def test_llama_attention_bias_covers_the_output_projection():
    config = config_from_hf(llama_json(attention_bias=True), name="m")
    assert config.attention_bias and config.o_proj_bias


def test_mistral_context_is_capped_to_its_sliding_window():
    raw = llama_json(
        architectures=["MistralForCausalLM"], sliding_window=1024, max_position_embeddings=32768, head_dim=64
    )
    config = config_from_hf(raw, name="mistral")
    assert config.max_position_embeddings == 1024 and config.sliding_window == 1024
    assert config.head_dim == 64 and config.q_size == 512


def test_eos_lists_and_generation_config_ids_are_merged():
    config = config_from_hf(llama_json(eos_token_id=[2, 7]), name="m", extra_eos=(7, 9))
    assert config.eos_token_ids == (2, 7, 9)


def test_unsupported_architecture_is_named():
    message = "unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM"
    with pytest.raises(UnsupportedModelError, match=message):
        config_from_hf(llama_json(architectures=["GPT2LMHeadModel"]), name="m")


def test_missing_key_and_inconsistent_heads_are_load_errors():
    raw = llama_json()
    del raw["intermediate_size"]
    with pytest.raises(ModelLoadError, match="lacks 'intermediate_size'"):
        config_from_hf(raw, name="m")
    with pytest.raises(ModelLoadError, match="8 heads not divisible by 3 KV heads"):
        config_from_hf(llama_json(num_key_value_heads=3), name="m")


def test_mlp_bias_is_refused():
    with pytest.raises(UnsupportedModelError, match="mlp_bias"):
        config_from_hf(llama_json(mlp_bias=True), name="m")


def test_embedded_gguf_metadata(smollm2):
    config = smollm2.config
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (30, 9, 3, 64)
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (576, 1536, 49152)
    assert config.rope_theta == 100000.0 and config.max_position_embeddings == 8192
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.tie_word_embeddings
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
