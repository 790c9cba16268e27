"""A hybrid model's KV pool (pdserve/kv/page_groups.py): pages of one layer group each, the
windowed groups' pages given back as the window moves, outputs still transformers' token for token.

The model is tiny_gemma3 (tests/helpers/tiny_models.py): 7 layers, six with a 10-token window and
one global, so pages hold one layer and a table has 7 entries per block; blocks of 4 tokens, so
a query sees at most 3 blocks of a windowed group (10 positions can straddle 4 blocks)."""

from __future__ import annotations

import pytest

from pdserve.config import CacheConfig, PreemptionConfig
from pdserve.kv.manager import KVManager
from pdserve.kv.page_groups import NULL_PAGE, PageGroups
from pdserve.model import load_model
from pdserve.requests import PreemptionMode, Request, SamplingParams
from tests.engine.driver import Arrival, assert_all_blocks_released, make_engine, run, step, Trace, add
from tests.engine.oracle import Oracle
from tests.helpers.tiny_models import GEMMA3_WINDOW, tiny_gemma3
from tests.engine.driver import tiny_prompt

pytestmark = pytest.mark.timeout(300)

BLOCK = 4
NEW_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
GEMMA_270M = (512,) * 5 + (None,) + (512,) * 5 + (None,) + (512,) * 5 + (None,)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_gemma3(tmp_path_factory.mktemp("gemma3") / "tiny_gemma3")


@pytest.fixture(scope="module")
def loaded(folder):
    return load_model(str(folder))


@pytest.fixture(scope="module")
def oracle(folder):
    return Oracle({"gemma3": folder})


def test_gemma_270m_layers_make_pages_of_three_layers_in_six_groups():
    groups = PageGroups.of(GEMMA_270M)
    assert (groups.page_layers, groups.windows) == (3, (None,) + (512,) * 5)
    assert [groups.layer_group[layer] for layer in (5, 11, 17)] == [0, 0, 0]
    assert sorted(zip(groups.layer_group, groups.layer_slot)) == sorted({(g, s) for g in range(6) for s in range(3)})


def test_a_model_of_one_kind_of_layer_keeps_one_group():
    assert PageGroups.of((None,) * 4) == PageGroups.single(4)
    assert PageGroups.of((8,) * 4).count == 1 and not PageGroups.of((8,) * 4).windowed


def test_a_windowed_group_needs_only_the_blocks_its_next_query_sees():
    groups = PageGroups.of((10, None))  # group 0 global, group 1 windowed
    assert groups.dead_blocks(0, 100, BLOCK) == 0
    assert groups.dead_blocks(1, 12, BLOCK) == 0  # the query at 12 sees 3..12: block 0 holds 3
    assert groups.dead_blocks(1, 13, BLOCK) == 1  # sees 4..13
    assert groups.needed(3, 13, BLOCK) == [True, False, True, True, True, True]


def _request(rid: str, prompt: list[int]) -> Request:
    return Request(rid, prompt, GREEDY)


def _grown(kv: KVManager, rid: str, prompt: list[int], cache: bool) -> Request:
    """A request computed to 88 tokens in chunks of 8, its table grown for 96; `cache`: its full
    blocks go into the prefix cache after each chunk (as the engine's steps do)."""
    request = _request(rid, prompt)
    kv.admit(request, kv.match(request), 8)
    for _ in range(11):
        request.num_computed_tokens += 8
        if cache:
            kv.cache_computed(request)
        kv.allocate_slots(request, 8)
        kv.check_integrity()
    return request


def test_a_long_table_holds_its_window_and_gives_the_rest_back():
    groups = PageGroups.of((10, None))
    kv = KVManager(CacheConfig(block_size=BLOCK, num_blocks=64, num_host_blocks=64, prefix_cache=False), groups)
    request = _grown(kv, "r", list(range(3, 103)), cache=False)
    table = kv.block_table("r")
    assert len(table) == 2 * 24 and kv.num_blocks("r") == 24  # 96 tokens
    windowed = table[1::2]
    assert all(page != NULL_PAGE for page in table[0::2])  # the global group keeps the whole context
    assert windowed.count(NULL_PAGE) == groups.dead_blocks(1, 88, BLOCK) == 19
    assert kv.stats().active == 24 + 5
    plan = kv.swap_out(request)
    assert len(plan.pairs) == 22 + 3 and kv.stats().active == 0  # the 88 computed tokens
    back = kv.swap_in(request)
    assert len(back.pairs) == 22 + 3
    assert [p == NULL_PAGE for p in kv.block_table("r")] == [p == NULL_PAGE for p in table[:44]]
    kv.end_step()
    kv.free(request)
    kv.check_integrity()
    assert (kv.stats().active, kv.stats().swapped) == (0, 0)


@pytest.mark.parametrize("cached_as_computed", [False, True])
def test_a_prefix_match_ends_where_the_window_before_it_is_cached(cached_as_computed):
    groups = PageGroups.of((10, None))
    kv = KVManager(CacheConfig(block_size=BLOCK, num_blocks=64, num_host_blocks=0), groups)
    prompt = list(range(3, 103))
    kv.free(_grown(kv, "first", prompt, cache=cached_as_computed))
    kv.check_integrity()
    again = _request("again", prompt)
    match = kv.match(again)
    assert match.num_tokens == 88  # 22 full blocks computed; the window before 88 is still cached
    dead = groups.dead_blocks(1, 88, BLOCK)
    assert [p == NULL_PAGE for p in match.blocks[1::2]] == [i < dead for i in range(22)]
    kv.admit(again, match, 11)
    kv.check_integrity()
    kv.free(again)
    kv.prefix.evict(10**6)
    kv.check_integrity()
    assert kv.stats().free == kv.stats().total


def test_a_match_whose_window_was_evicted_ends_earlier():
    groups = PageGroups.of((10, None))
    kv = KVManager(CacheConfig(block_size=BLOCK, num_blocks=64, num_host_blocks=0), groups)
    prompt = list(range(3, 103))
    kv.free(_grown(kv, "first", prompt, cache=True))
    windowed_last = kv.match(_request("probe", prompt)).blocks[-1]
    while kv.device.num_cached and windowed_last in kv.device.least_recently_cached(kv.device.num_cached):
        kv.prefix.evict(1)  # least recently released first: windowed pages of early blocks, then later ones
    kv.check_integrity()
    match = kv.match(_request("again", prompt))
    assert match.num_tokens < 88
    assert all(p != NULL_PAGE for p in match.blocks[-2:])  # its window's pages are there


@pytest.mark.parametrize("chunk", [7, 64])
def test_greedy_equals_transformers_while_windowed_pages_go_back(loaded, oracle, chunk):
    engine = make_engine(loaded, block_size=BLOCK, num_blocks=128, max_chunk_tokens=chunk, token_budget=96)
    prompts = {f"r{n}": tiny_prompt(n, loaded.config.vocab_size, seed=n) for n in (5, 33, 100)}
    trace, peak = Trace(), 0
    for rid, prompt in prompts.items():
        add(engine, trace, Arrival(rid, prompt, GREEDY))
    while engine.has_unfinished():
        step(engine, trace)
        peak = max(peak, engine.scheduler.stats().kv.active)
    for rid, prompt in prompts.items():
        assert trace.tokens(rid) == oracle.greedy("gemma3", prompt, NEW_TOKENS), rid
    groups = engine.kv.groups
    full = sum(groups.count * -(-(len(p) + NEW_TOKENS) // BLOCK) for p in prompts.values())
    assert peak < full  # the long prompt's windowed groups held its window only
    assert_all_blocks_released(engine)


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_preempted_requests_resume_token_exact(loaded, oracle, mode):
    swap = mode == PreemptionMode.SWAP
    preemption = PreemptionConfig(recompute_below_tokens=0 if swap else 10**9, swap_above_tokens=0 if swap else 10**9)
    # 84 pages, 48 tokens at most a request: each holds up to 12 global pages and 6 x 4 windowed
    engine = make_engine(loaded, block_size=BLOCK, num_blocks=12, num_host_blocks=64 if swap else 0,
                         max_chunk_tokens=16, token_budget=64, preemption=preemption)
    prompts = {f"r{i}": tiny_prompt(24 + 4 * i, loaded.config.vocab_size, seed=100 + i) for i in range(4)}
    trace = run(engine, [Arrival(rid, p, GREEDY) for rid, p in prompts.items()])
    assert trace.preemptions and trace.modes() == {mode}
    for rid, prompt in prompts.items():
        assert trace.tokens(rid) == oracle.greedy("gemma3", prompt, NEW_TOKENS), rid
    assert_all_blocks_released(engine)
    assert GEMMA3_WINDOW < 24  # every prompt is longer than the window


def test_a_later_turn_reuses_the_cached_prefix_and_equals_transformers(loaded, oracle):
    engine = make_engine(loaded, block_size=BLOCK, num_blocks=128, max_chunk_tokens=16, token_budget=64)
    prompt = tiny_prompt(60, loaded.config.vocab_size, seed=3)
    first = run(engine, [Arrival("t1", prompt, GREEDY)])
    turn = [*prompt, *first.tokens("t1"), 7, 8, 9]
    second = run(engine, [Arrival("t2", turn, GREEDY)])
    assert second.requests["t2"].num_cached_tokens >= 60 // BLOCK * BLOCK
    assert second.tokens("t2") == oracle.greedy("gemma3", turn, NEW_TOKENS)
    assert_all_blocks_released(engine)
