import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.sim import StepCostModel, get_hardware, get_shape, hardware_profiles, model_shapes
from pdserve.sim.bounds import (
    min_decode_step_time,
    min_prefill_time,
    min_step_time,
    min_total_prefill_time,
    prefill_flops,
)

GiB = 1 << 30
LLAMA70B = get_shape("llama-3.1-70b")
H100 = get_hardware("h100-sxm")


def test_64k_prefill_of_70b_on_eight_h100_takes_about_1_86_s():
    assert prefill_flops(LLAMA70B, 65536) == pytest.approx(1.5e16, rel=0.03)
    assert min_prefill_time(LLAMA70B, H100, 65536, 8) == pytest.approx(1.86, rel=0.02)


def test_2k_chunk_linear_and_late_attention_flops():
    assert LLAMA70B.linear_flops(2048, sampled=0) == pytest.approx(2.9e14, rel=0.05)
    assert LLAMA70B.attention_flops(2048, 65536) == pytest.approx(3.5e14, rel=0.02)
    alone = min_step_time(LLAMA70B, H100, [(2048, 2048)], 8)
    assert alone == pytest.approx(0.036, rel=0.05)
    assert alone > 0.0148


def test_pure_decode_step_streams_the_weights():
    assert LLAMA70B.weight_bytes() == pytest.approx(141e9, rel=0.005)
    assert LLAMA70B.weight_bytes() / 8 == pytest.approx(17.6e9, rel=0.005)
    assert min_decode_step_time(LLAMA70B, H100, [], 8) == pytest.approx(5.3e-3, rel=0.03)


def test_kv_per_token_of_70b_is_320_kib():
    assert LLAMA70B.kv_bytes_per_token() == 320 * 1024
    assert (128_000 + 658_000) * LLAMA70B.kv_bytes_per_token() == pytest.approx(240 * GiB, rel=0.01)


def test_decode_bounds_with_long_documents_running():
    docs_and_chats = [65_800] * 10 + [1_300] * 100
    assert min_decode_step_time(LLAMA70B, H100, docs_and_chats, 8) == pytest.approx(0.016, rel=0.1)
    full_kv = [int(4 * 45e9 / LLAMA70B.kv_bytes_per_token())]
    assert min_decode_step_time(LLAMA70B, H100, full_kv, 4) == pytest.approx(0.024, rel=0.03)


def test_whole_workload_prefill_needs_twenty_seconds_of_eight_gpus():
    prompts = [1024] * 100 + [65536] * 10
    assert min_total_prefill_time(LLAMA70B, H100, prompts, 8) > 20.0
    model = StepCostModel(H100, LLAMA70B, 8)
    chunked = sum(model.step_time([(2048, end)]).total_s for end in range(2048, 65537, 2048))
    assert chunked > min_prefill_time(LLAMA70B, H100, 65536, 8)


def test_empty_step_bound_is_zero():
    assert min_step_time(LLAMA70B, H100, [], 8) == 0.0


def _valid_tps(shape):
    return [tp for tp in (1, 2, 3, 4, 8) if shape.num_kv_heads % tp == 0]


chunk = st.integers(1, 8192).flatmap(lambda q: st.tuples(st.just(q), st.integers(q, 131072)))
configs = st.sampled_from(sorted(model_shapes())).flatmap(
    lambda s: st.tuples(st.just(s), st.sampled_from(sorted(hardware_profiles())),
                        st.sampled_from(_valid_tps(get_shape(s))))
)


@settings(max_examples=300, deadline=None)
@given(configs, st.lists(chunk, min_size=1, max_size=40))
def test_cost_model_never_beats_the_roofline(config, chunks):
    shape_name, hw_name, tp = config
    shape, hw = get_shape(shape_name), get_hardware(hw_name)
    cost = StepCostModel(hw, shape, tp).step_time(chunks)
    assert cost.total_s >= min_step_time(shape, hw, chunks, tp)


@settings(max_examples=200, deadline=None)
@given(configs, st.lists(st.integers(1, 131072), min_size=1, max_size=300))
def test_decode_steps_never_beat_the_bandwidth_bound(config, contexts):
    shape_name, hw_name, tp = config
    shape, hw = get_shape(shape_name), get_hardware(hw_name)
    cost = StepCostModel(hw, shape, tp).step_time([(1, c) for c in contexts])
    assert cost.total_s >= min_decode_step_time(shape, hw, contexts, tp)


@settings(max_examples=200, deadline=None)
@given(configs, st.integers(1, 131072), st.integers(64, 16384))
def test_chunked_prefill_never_beats_the_compute_bound(config, prompt, chunk_size):
    shape_name, hw_name, tp = config
    shape, hw = get_shape(shape_name), get_hardware(hw_name)
    model = StepCostModel(hw, shape, tp)
    ends = list(range(chunk_size, prompt, chunk_size)) + [prompt]
    starts = [0] + ends[:-1]
    total = sum(model.step_time([(end - start, end)]).total_s for start, end in zip(starts, ends))
    assert total >= min_prefill_time(shape, hw, prompt, tp)
