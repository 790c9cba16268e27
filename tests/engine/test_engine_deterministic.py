"""Deterministic mode in the engine: 48 requests, half greedy and half seeded, each with its
tokens' raw log-probabilities (the logits' fingerprint), come out bitwise the same alone and all
together, under every chunking and arrival order, on one thread or two, with prefix-cache hits,
after preemption by recompute and by swap, prefilled by another engine, resumed from their tokens
so far, and moved with their KV to another engine mid-stream."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pdserve.config import EngineConfig, PreemptionConfig
from pdserve.engine.engine import Engine
from pdserve.native.loader import Loaded
from pdserve.requests import Priority, SamplingParams
from tests.engine.driver import tiny_prompt
from tests.engine.exact_runs import (Ask, Run, deterministic_model, drive, exact_engine, moved, prefilled_elsewhere,
                                     step)

pytestmark = pytest.mark.timeout(600)

MODEL = "llama_gqa_llama3"
REQUESTS = 48
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=0, max_tokens=10, ignore_eos=True, logprobs=3)
SHARED = 24  # prompt tokens every fourth request shares with the one before it


def asks(vocab: int) -> list[Ask]:
    """Prompts of 3-90 tokens; odd requests seeded (each its own seed), every fourth sharing the
    previous one's first SHARED tokens; arriving over the first 24 steps."""
    made: list[Ask] = []
    for i in range(REQUESTS):
        prompt = tiny_prompt(3 + (i * 37) % 88, vocab, seed=1000 + i)
        if i % 4 == 3:
            prompt = made[-1].prompt[:SHARED] + prompt
        sampling = dataclasses.replace(SEEDED, seed=i) if i % 2 else GREEDY
        made.append(Ask(f"r{i}", prompt, sampling, at=i // 2))
    return made


@pytest.fixture(scope="module")
def loaded(tiny_loaded):
    return deterministic_model(tiny_loaded[MODEL])


@pytest.fixture(scope="module")
def requests(loaded) -> list[Ask]:
    return asks(loaded.config.vocab_size)


@pytest.fixture(scope="module")
def alone(loaded, requests) -> dict[str, tuple]:
    """Each request alone in an engine of its own, its prompt in one chunk."""
    return {a.request_id: drive(exact_engine(loaded), [dataclasses.replace(a, at=0)]).output(a.request_id)
            for a in requests}


def differing(run: Run, alone: dict[str, tuple], ids=None) -> list[str]:
    return [rid for rid in (ids or alone) if run.output(rid) != alone[rid]]


def test_requests_really_sample_and_fill_their_lengths(alone, requests):
    assert all(len(out) == GREEDY.max_tokens for out in alone.values())
    seeded = [alone[a.request_id] for a in requests if a.sampling.seed is not None]
    assert any(any(token != top[0][0] for token, _, top in out) for out in seeded)  # some draw is not the argmax


@pytest.mark.parametrize(("token_budget", "max_chunk_tokens", "threads"),
                         [(256, 1024, 1), (256, 1, 2), (64, 7, 1), (16, 16, 2), (512, 64, 2)])
def test_all_together_under_every_chunking(loaded, requests, alone, token_budget, max_chunk_tokens, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run = drive(exact_engine(loaded, token_budget=token_budget, max_chunk_tokens=max_chunk_tokens), requests)
    finally:
        torch.set_num_threads(before)
    assert differing(run, alone) == []


def test_in_any_arrival_order_with_prefix_cache_hits(loaded, requests, alone):
    reordered = [dataclasses.replace(a, at=(REQUESTS - i) % 7) for i, a in enumerate(reversed(requests))]
    run = drive(exact_engine(loaded, max_chunk_tokens=32), reordered)
    assert run.cached_tokens > 0
    assert differing(run, alone) == []


@pytest.mark.parametrize("swap", [False, True], ids=["recompute", "swap"])
def test_after_preemption(loaded, requests, alone, swap):
    """A pool of 60 blocks of 4 tokens: BATCH requests arrive first and are preempted by the
    NORMAL ones after them (a prompt of up to 90 tokens and its 10 out need 25 blocks)."""
    preemption = PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0) if swap else PreemptionConfig()
    batch = [dataclasses.replace(a, priority=Priority.BATCH, at=0) for a in requests[:12]]
    normal = [dataclasses.replace(a, at=4 + i) for i, a in enumerate(requests[12:24])]
    engine = exact_engine(loaded, num_blocks=60, num_host_blocks=256 if swap else 0, max_chunk_tokens=16,
                          preemption=preemption)
    run = drive(engine, batch + normal)
    assert run.preemption_modes == {"swap" if swap else "recompute"}
    assert differing(run, alone, [a.request_id for a in batch + normal]) == []


def test_prefilled_by_another_engine(loaded, requests, alone):
    prefill = exact_engine(loaded, hold_blocks=True, max_chunk_tokens=8)
    decode = exact_engine(loaded)
    for ask in requests[:8]:
        assert prefilled_elsewhere(prefill, decode, ask) == alone[ask.request_id], ask.request_id


def test_resumed_from_its_tokens_so_far(loaded, requests, alone):
    """As a resume after a fault: the prompt and the tokens already out prefilled again, beside
    other requests, and the rest drawn at the same indices."""
    engine = exact_engine(loaded, max_chunk_tokens=5)
    neighbours = [dataclasses.replace(a, at=0) for a in requests[20:28]]
    run = drive(engine, neighbours)
    for cut, ask in zip((1, 4, 9), requests[:3]):
        before = alone[ask.request_id][:cut]
        engine.add_request(ask.request_id, ask.prompt, ask.sampling, output_token_ids=[t for t, _, _ in before])
        run.outputs[ask.request_id] = list(before)
        engine.add_request("n" + ask.request_id, requests[30].prompt, requests[30].sampling)
        while engine.has_unfinished():
            step(engine, run)
        assert run.output(ask.request_id) == alone[ask.request_id]
    assert differing(run, alone, [a.request_id for a in neighbours]) == []


def test_moved_with_its_kv_to_another_engine(loaded, requests, alone):
    source, target = exact_engine(loaded), exact_engine(loaded, max_chunk_tokens=6)
    ask, others = requests[5], [dataclasses.replace(a, at=0) for a in requests[30:34]]
    run = Run()
    source.add_request(ask.request_id, ask.prompt, ask.sampling)
    while len(run.outputs.get(ask.request_id, ())) < 4:
        step(source, run)
    for other in others:
        target.add_request(other.request_id, other.prompt, other.sampling)
    step(target, run)
    moved(source, target, ask, run)
    while target.has_unfinished():
        step(target, run)
    assert differing(run, alone, [ask.request_id, *(a.request_id for a in others)]) == []


def test_without_the_c_kernels(tiny_loaded, requests, alone, monkeypatch):
    """The fallbacks: projections in fixed-shape tiles, attention a torch call per row. Their bits
    differ from the C kernels', so the reference is their own alone-run."""
    import pdserve.cpu.row_independent as row_independent
    import pdserve.native.paged_decode as paged_decode

    monkeypatch.setattr(row_independent, "load_row_panels", lambda device, dtype: Loaded(None, "a test"))
    monkeypatch.setattr(paged_decode, "load_native_decode", lambda: Loaded(None, "a test"))
    model = deterministic_model(tiny_loaded[MODEL])
    few = [dataclasses.replace(a, at=i % 3) for i, a in enumerate(requests[:10])]
    own = {a.request_id: drive(exact_engine(model), [dataclasses.replace(a, at=0)]).output(a.request_id) for a in few}
    run = drive(exact_engine(model, token_budget=32, max_chunk_tokens=5), few)
    assert differing(run, own) == []
    assert type(exact_engine(model).runner.attn.kernel).__name__ == "TorchQueries"


def test_a_model_not_laid_out_row_by_row_is_refused(tiny_loaded):
    with pytest.raises(ValueError, match="row by row"):
        Engine(EngineConfig(deterministic=True), loaded=tiny_loaded[MODEL])


def test_the_embedded_model_alone_and_together(smol_loaded):
    """SmolLM2-135M (9 heads over 3 KV heads of 64): its fused decode steps, panels and C kernels."""
    model = deterministic_model(smol_loaded)
    few = [dataclasses.replace(a, at=i % 3) for i, a in enumerate(asks(model.config.vocab_size)[:8])]
    own = {a.request_id: drive(exact_engine(model), [dataclasses.replace(a, at=0)]).output(a.request_id) for a in few}
    run = drive(exact_engine(model, token_budget=48, max_chunk_tokens=13), few)
    assert differing(run, own) == []


def test_tensor_parallelism_is_refused():
    from pdserve.engine.engine_model import load_engine_model

    with pytest.raises(ValueError, match="one rank"):
        load_engine_model(EngineConfig(deterministic=True, tensor_parallel_size=2))
