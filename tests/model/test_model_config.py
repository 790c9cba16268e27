"""config.json and GGUF metadata -> ModelConfig."""

from __future__ import annotations

import pytest

from pdserve.kv.kv_shape import KVShape
from pdserve.checkpoint.errors import ModelLoadError, UnsupportedModelError
from pdserve.checkpoint.hf_config import config_from_hf
from pdserve.checkpoint.model_config import Activation, Architecture, NormStyle
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


@pytest.mark.parametrize("name", ["Qwen3MoeForCausalLM", "Gemma2ForCausalLM", "Gemma3ForConditionalGeneration",
                                  "Phi3ForCausalLM"])
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


def gemma3_json(**overrides):
    """google/gemma-3-270m's config.json as the hub has it (the older, flat rope keys)."""
    raw = llama_json(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=640,
                     intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                     head_dim=256, query_pre_attn_scalar=256, sliding_window=512, rope_theta=1e6,
                     rope_local_base_freq=10000.0, rope_scaling=None, hidden_activation="gelu_pytorch_tanh",
                     attn_logit_softcapping=None, final_logit_softcapping=None, max_position_embeddings=32768)
    raw.update(overrides)
    return raw


def test_gemma3_windows_every_layer_but_each_sixth_and_ties_embeddings_by_default():
    config = config_from_hf(gemma3_json(), name="g")
    assert config.architecture is Architecture.GEMMA3
    assert config.layer_windows == ((512,) * 5 + (None,)) * 3 and config.window(5) is None
    assert [config.local_rope(i) for i in range(6)] == [True] * 5 + [False]
    assert (config.rope_theta, config.local_rope_theta, config.rope_scaling) == (1e6, 1e4, NoRopeScaling())
    assert config.attention_scale is None and config.embedding_scale == 640**0.5
    assert (config.norm_style, config.activation) == (NormStyle.GEMMA, Activation.GELU_TANH)
    assert config.tie_word_embeddings and config.max_position_embeddings == 32768 and config.sliding_window is None
    assert config.kv_shape(16) == KVShape(num_layers=18, num_kv_heads=1, head_dim=256, block_size=16)


def test_gemma3_layer_types_and_global_rope_scaling_in_the_current_form():
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    kinds = ["full_attention", "sliding_attention"] * 9
    raw = gemma3_json(rope_parameters=rope, layer_types=kinds, query_pre_attn_scalar=168, final_logit_softcapping=30.0)
    del raw["rope_theta"], raw["rope_local_base_freq"]
    config = config_from_hf(raw, name="g")
    assert config.layer_windows == (None, 512) * 9
    assert (config.rope_theta, config.rope_scaling, config.local_rope_theta) == (1e6, LinearRopeScaling(8.0), 1e4)
    assert config.attention_scale == 168**-0.5 and config.final_logit_softcap == 30.0


@pytest.mark.parametrize(("override", "message"), [
    ({"attn_logit_softcapping": 50.0}, "attention-logit softcapping"),
    ({"use_bidirectional_attention": True}, "bidirectional attention"),
    ({"hidden_activation": "gelu"}, "hidden activation 'gelu'"),
    ({"layer_types": ["chunked_attention"] * 18}, "layer_types"),
])
def test_gemma3_variants_not_run_here_are_named(override, message):
    with pytest.raises(UnsupportedModelError, match=message):
        config_from_hf(gemma3_json(**override), name="g")
