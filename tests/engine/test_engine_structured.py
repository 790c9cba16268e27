"""Structured output through the whole Engine on the embedded model: sampled outputs under a
held-out schema all validate (and the same prompts unconstrained do not), greedy constrained
outputs survive preemption by recompute and by swap unchanged, a resume rebuilds the grammar from
the tokens it brings and continues as the unbroken run did, and an end the grammar requires wins
over min_tokens. Every block comes back."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from pdserve.config import PreemptionConfig
from pdserve.errors import InvalidRequestError
from pdserve.requests import Constraint, ConstraintKind, FinishReason, PreemptionMode, SamplingParams
from pdserve.tokenizer import ChatMessage
from tests.engine.driver import Arrival, assert_all_blocks_released, make_engine, run

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 16},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "horror", "sci-fi"]}, "minItems": 1,
                   "maxItems": 2},
        "rating": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["title", "year", "genres", "rating"],
    "additionalProperties": False,
}
# Bounded by construction (a title of at most 16 characters, bounded integers, at most 2 genres): every
# output ends inside max_tokens, so each one is whole JSON.
CONSTRAINED = SamplingParams(max_tokens=80, temperature=0.7, constraint=Constraint(
    ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)))
GREEDY = dataclasses.replace(CONSTRAINED, temperature=0.0)
ASKS = ("Describe a film you like as JSON.", "Give me a movie recommendation in JSON.",
        "A film from the nineties, as JSON please.", "Invent a horror film and describe it as JSON.")


def _prompt(tokenizer, ask: str) -> list[int]:
    return tokenizer.apply_chat_template([ChatMessage("user", ask)])


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _texts(engine, tokenizer, prompts, sampling) -> list[str]:
    trace = run(engine, [Arrival(f"r{i}", p, sampling) for i, p in enumerate(prompts)])
    return [tokenizer.decode(trace.tokens(f"r{i}")) for i in range(len(prompts))]


def test_a_hundred_sampled_outputs_all_validate_and_unconstrained_ones_do_not(smol_loaded, smol_tokenizer):
    engine = make_engine(smol_loaded, block_size=16, num_blocks=1024, token_budget=2048, seed=7)
    prompts = [_prompt(smol_tokenizer, ASKS[i % len(ASKS)]) for i in range(100)]
    trace = run(engine, [Arrival(f"r{i}", p, CONSTRAINED) for i, p in enumerate(prompts)])
    texts = [smol_tokenizer.decode(trace.tokens(f"r{i}")) for i in range(len(prompts))]
    assert {r.finish_reason for r in trace.requests.values()} == {FinishReason.STOP}
    assert [t for t in texts if not _valid(t)] == []
    assert len(set(texts)) > 10  # sampled, not one answer a hundred times
    free = _texts(engine, smol_tokenizer, prompts[:8], dataclasses.replace(CONSTRAINED, constraint=None, max_tokens=24))
    assert not all(_valid(t) for t in free)  # the grammar did the work
    assert_all_blocks_released(engine)


@pytest.mark.parametrize("mode", [PreemptionMode.RECOMPUTE, PreemptionMode.SWAP])
def test_greedy_constrained_outputs_survive_preemption(smol_loaded, smol_tokenizer, mode):
    prompts = [_prompt(smol_tokenizer, ask) for ask in ASKS[:3]]
    calm = _texts(make_engine(smol_loaded, block_size=16, num_blocks=256), smol_tokenizer, prompts, GREEDY)
    preemption = (PreemptionConfig(recompute_below_tokens=10**9) if mode is PreemptionMode.RECOMPUTE
                  else PreemptionConfig(recompute_below_tokens=0, swap_above_tokens=0))
    longest = max(len(p) for p in prompts) + GREEDY.max_tokens
    tight = make_engine(smol_loaded, block_size=16, num_blocks=-(-longest // 16) + 2, num_host_blocks=64,
                        preemption=preemption)
    trace = run(tight, [Arrival(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)])
    assert trace.preemptions and trace.modes() == {mode}  # forced: the pool holds one request at a time
    assert [smol_tokenizer.decode(trace.tokens(f"r{i}")) for i in range(len(prompts))] == calm
    assert all(_valid(t) for t in calm)
    assert_all_blocks_released(tight)


def test_a_resume_rebuilds_the_grammar_from_its_tokens(smol_loaded, smol_tokenizer):
    prompt = _prompt(smol_tokenizer, ASKS[0])
    engine = make_engine(smol_loaded, block_size=16, num_blocks=256)
    whole = run(engine, [Arrival("whole", prompt, GREEDY)]).tokens("whole")
    for cut in (1, len(whole) // 2, len(whole) - 1):  # resumed after the first token, midway, before the end
        engine.add_request(f"resume-{cut}", prompt, GREEDY, output_token_ids=whole[:cut])
        tail, _ = _drain(engine, f"resume-{cut}")
        assert whole[:cut] + tail == whole, cut
    assert_all_blocks_released(engine)


def _drain(engine, request_id: str) -> tuple[list[int], FinishReason | None]:
    """Step until nothing is left; the tokens `request_id` streamed and why it finished."""
    tokens, reason = [], None
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.request_id == request_id:
                tokens.extend(out.new_token_ids)
                reason = out.request.finish_reason if out.finished else reason
    return tokens, reason


def test_an_end_the_grammar_requires_wins_over_min_tokens(smol_loaded, smol_tokenizer):
    engine = make_engine(smol_loaded, block_size=16, num_blocks=256)
    sampling = SamplingParams(max_tokens=30, temperature=0.0, min_tokens=20,
                              constraint=Constraint(ConstraintKind.CHOICE, choices=("yes", "no")))
    engine.add_request("short", _prompt(smol_tokenizer, "Is water wet?"), sampling)
    tokens, reason = _drain(engine, "short")
    assert smol_tokenizer.decode(tokens) in ("yes", "no") and reason == FinishReason.STOP
    assert_all_blocks_released(engine)


def test_a_constraint_that_does_not_build_is_refused_and_changes_nothing(smol_loaded, smol_tokenizer):
    engine = make_engine(smol_loaded, block_size=16, num_blocks=256)
    bad = SamplingParams(constraint=Constraint(ConstraintKind.GRAMMAR, "start: missing"))
    with pytest.raises(InvalidRequestError, match="missing"):
        engine.add_request("bad", _prompt(smol_tokenizer, "Hi"), bad)
    assert not engine.has_unfinished()
