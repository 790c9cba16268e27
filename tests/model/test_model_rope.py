"""Rotary frequencies and rotation equal transformers' bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pdserve.checkpoint.hf_config import config_from_hf
from pdserve.checkpoint.rope_scaling import FreqFactorRopeScaling
from pdserve.model.rope import RotaryEmbedding, apply_rope, inverse_frequencies

ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}


@pytest.mark.parametrize("kind", sorted(ROPES))
def test_inverse_frequencies_equal_transformers(kind):
    hf = LlamaConfig(hidden_size=1024, num_attention_heads=8, rope_parameters=ROPES[kind])
    ours = config_from_hf({**hf.to_dict(), "architectures": ["LlamaForCausalLM"]}, name="m")
    reference = LlamaRotaryEmbedding(hf)
    got = inverse_frequencies(ours.head_dim, ours.rope_theta, ours.rope_scaling)
    assert reference.attention_scaling == 1.0
    assert torch.equal(got, reference.inv_freq)


def test_llama3_scaling_keeps_high_divides_low_and_blends_medium_frequencies():
    scaling = config_from_hf({**LlamaConfig(rope_parameters=ROPES["llama3"]).to_dict(),
                              "architectures": ["LlamaForCausalLM"]}, name="m").rope_scaling
    plain = inverse_frequencies(128, 500000.0, FreqFactorRopeScaling((1.0,) * 64))
    ratio = plain / inverse_frequencies(128, 500000.0, scaling)
    assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(8.0)
    assert ((ratio > 1.0) & (ratio < 8.0)).any()


def test_frequency_factors_divide_the_frequencies():
    plain = inverse_frequencies(8, 10000.0, FreqFactorRopeScaling((1.0, 1.0, 1.0, 1.0)))
    scaled = inverse_frequencies(8, 10000.0, FreqFactorRopeScaling((1.0, 2.0, 4.0, 8.0)))
    torch.testing.assert_close(scaled, plain / torch.tensor([1.0, 2.0, 4.0, 8.0]))


def test_rotation_equals_transformers_rotate_half():
    rotary = RotaryEmbedding(64, 10000.0, FreqFactorRopeScaling((1.0,) * 32))
    positions = torch.tensor([0, 1, 5, 77, 4000])
    q, k = torch.randn(5, 6, 64), torch.randn(5, 2, 64)
    cos, sin = rotary(positions, torch.float32)  # [T, 1, 32]
    full_cos, full_sin = torch.cat([cos, cos], -1)[None, :, 0], torch.cat([sin, sin], -1)[None, :, 0]
    expected_q, expected_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], full_cos, full_sin)
    assert torch.equal(apply_rope(q, cos, sin), expected_q[0].transpose(0, 1))
    assert torch.equal(apply_rope(k, cos, sin), expected_k[0].transpose(0, 1))
