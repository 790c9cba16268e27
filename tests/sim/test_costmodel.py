import pytest

from pdserve.sim import (
    Link,
    StepCostModel,
    StepLoad,
    attended_positions,
    get_hardware,
    get_shape,
    hardware_profiles,
    model_shapes,
)

GB = 1e9


@pytest.fixture
def llama70b():
    return get_shape("llama-3.1-70b")


@pytest.fixture
def h100():
    return get_hardware("h100-sxm")


def test_registries_hold_the_named_profiles_and_shapes():
    assert set(hardware_profiles()) == {"h100-sxm", "h200", "a100-80gb", "cpu-local"}
    assert set(model_shapes()) == {"llama-3.1-8b", "llama-3.1-70b", "smollm2-135m"}
    with pytest.raises(KeyError, match="known"):
        get_hardware("tpu")
    with pytest.raises(KeyError, match="known"):
        get_shape("gpt-5")


def test_h200_differs_from_h100_only_in_memory():
    h100, h200 = get_hardware("h100-sxm"), get_hardware("h200")
    assert h200.peak_flops == h100.peak_flops == 989e12
    assert (h200.mem_bandwidth_bytes_s, h200.mem_bytes) == (4.8e12, 141e9)


def test_calibrated_replaces_measured_fields_and_validates():
    cpu = get_hardware("cpu-local")
    fast = cpu.calibrated(peak_flops=120e9, host_link_bytes_s=9e9)
    assert (fast.peak_flops, fast.host_link_bytes_s, cpu.peak_flops) == (120e9, 9e9, 100e9)
    with pytest.raises(ValueError):
        cpu.calibrated(compute_efficiency=1.5)
    with pytest.raises(ValueError):
        cpu.calibrated(mem_bandwidth_bytes_s=0)


def test_parameter_counts_match_the_published_sizes():
    assert get_shape("llama-3.1-70b").params() == pytest.approx(70.6e9, rel=0.005)
    assert get_shape("llama-3.1-8b").params() == pytest.approx(8.03e9, rel=0.005)
    assert get_shape("smollm2-135m").params() == pytest.approx(134.5e6, rel=0.005)


def test_tied_embeddings_are_stored_and_streamed_once():
    smol = get_shape("smollm2-135m")
    assert smol.streamed_weight_bytes() == smol.weight_bytes() == smol.params() * 4


def test_attended_positions_closed_form_matches_the_causal_sum():
    for q, c in [(1, 1), (1, 9), (5, 5), (3, 10), (7, 100), (0, 4)]:
        assert attended_positions(q, c) == sum(range(c - q + 1, c + 1))
    with pytest.raises(ValueError):
        attended_positions(5, 4)


def test_chunked_attention_sums_to_whole_prompt_attention(llama70b):
    chunks = [(2048, end) for end in range(2048, 65536 + 1, 2048)]
    assert sum(llama70b.attention_flops(q, c) for q, c in chunks) == llama70b.attention_flops(65536, 65536)


def test_step_load_merges_and_decodes_match_chunk_lists():
    chunks = [(512, 4096), (1, 300), (1, 77)]
    assert StepLoad.of(chunks) == StepLoad.of(chunks[:1]) + StepLoad.of(chunks[1:])
    assert StepLoad.of(chunks[1:]) == StepLoad.decodes(2, 377)


def test_step_time_formula_on_a_single_device(h100):
    shape = get_shape("llama-3.1-8b")
    model = StepCostModel(h100, shape, tp=1)
    cost = model.step_time([(100, 300)])
    flops = 100 * shape.linear_flops_per_token() + shape.lm_head_flops() + shape.attention_flops(100, 300)
    nbytes = shape.streamed_weight_bytes() + 300 * shape.kv_bytes_per_token()
    assert cost.flops == pytest.approx(flops)
    assert cost.compute_s == pytest.approx(flops / (989e12 * 0.7))
    assert cost.memory_s == pytest.approx(nbytes / (3.35e12 * 0.85))
    assert cost.comm_s == 0.0
    assert cost.total_s == pytest.approx(max(cost.compute_s, cost.memory_s) + h100.step_overhead_s)


def test_tensor_parallel_all_reduce_cost(llama70b, h100):
    one, eight = StepCostModel(h100, llama70b, 1), StepCostModel(h100, llama70b, 8)
    a, b = one.step_time([(2048, 2048)]), eight.step_time([(2048, 2048)])
    assert b.compute_s == pytest.approx(a.compute_s / 8)
    ring = 2 * 7 / 8 * 2048 * 8192 * 2 / h100.interconnect_bytes_s
    assert b.comm_s == pytest.approx(160 * (ring + h100.collective_latency_s))


def test_tp_must_divide_kv_heads(llama70b, h100):
    for tp in (1, 2, 4, 8):
        StepCostModel(h100, llama70b, tp)
    for tp in (0, 3, 16):
        with pytest.raises(ValueError, match="KV heads"):
            StepCostModel(h100, llama70b, tp)
    StepCostModel(get_hardware("cpu-local"), get_shape("smollm2-135m"), 3)


def test_decode_is_memory_bound_and_long_chunks_compute_bound(llama70b, h100):
    model = StepCostModel(h100, llama70b, 8)
    assert not model.step_time([(1, 2000)] * 200).compute_bound
    assert model.step_time([(2048, 2048)]).compute_bound


def test_seed_diagram_step_of_1k_chunk_and_200_decodes_is_tens_of_ms(llama70b, h100):
    cost = StepCostModel(h100, llama70b, 8).step_time([(1024, 1024)] + [(1, 1500)] * 200)
    assert 0.030 < cost.total_s < 0.060


def test_empty_step_costs_only_its_swaps(llama70b, h100):
    model = StepCostModel(h100, llama70b, 8)
    assert model.step_time([]).total_s == 0.0
    swap_only = model.step_time([], swap_out_bytes=8 * 64e9)
    assert swap_only.total_s == swap_only.swap_s == pytest.approx(1.0)


def test_swaps_add_to_the_step_in_both_directions(llama70b, h100):
    model = StepCostModel(h100, llama70b, 4)
    plain = model.step_time([(1, 100)])
    swapped = model.step_time([(1, 100)], swap_out_bytes=1e9, swap_in_bytes=2e9)
    assert swapped.total_s - plain.total_s == pytest.approx(3e9 / (4 * 64e9))


def test_long_request_swap_is_tens_of_ms_and_beats_recompute(llama70b, h100):
    model = StepCostModel(h100, llama70b, 8)
    tokens = 32768
    swap_s = model.swap_time(tokens * llama70b.kv_bytes_per_token())
    recompute_s = model.step_time([(tokens, tokens)]).total_s
    assert 0.005 < swap_s < 0.05
    assert swap_s < recompute_s / 10


def test_kv_transfer_uses_the_chosen_link(llama70b, h100):
    model = StepCostModel(h100, llama70b, 4)
    nbytes = 65536 * llama70b.kv_bytes_per_token()
    assert model.kv_transfer_time(65536) == pytest.approx(nbytes / (4 * 50e9))
    assert model.kv_transfer_time(65536, Link.INTERCONNECT) == pytest.approx(nbytes / (4 * 450e9))
    with pytest.raises(ValueError):
        model.transfer_time(-1, Link.HOST)


def test_kv_capacity_matches_the_brief(llama70b, h100):
    eight, four = StepCostModel(h100, llama70b, 8), StepCostModel(h100, llama70b, 4)
    assert eight.free_bytes_per_device() == pytest.approx(62.4e9, rel=0.01)
    assert 4 * four.free_bytes_per_device() == pytest.approx(180e9, rel=0.01)
    workload_tokens = 128_000 + 658_000
    assert workload_tokens < eight.kv_capacity_tokens(0.95)
    assert workload_tokens > four.kv_capacity_tokens(0.95)
    with pytest.raises(ValueError, match="does not fit"):
        StepCostModel(h100, llama70b, 1).free_bytes_per_device()


def test_cost_grows_with_every_added_chunk(llama70b, h100):
    model = StepCostModel(h100, llama70b, 8)
    chunks: list[tuple[int, int]] = []
    last = 0.0
    for q, c in [(1, 10), (1, 5000), (512, 512), (1, 64000), (2048, 40000)]:
        chunks.append((q, c))
        total = model.step_time(chunks).total_s
        assert total > last
        last = total
