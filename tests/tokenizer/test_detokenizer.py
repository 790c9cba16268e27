"""Streaming detokenisation: concatenated pushes equal a one-shot decode, and no push ever
carries half a character."""

from __future__ import annotations

import random

import pytest
from tests.tokenizer.texts import VARIED_TEXTS

from pdserve.tokenizer import ChatMessage, IncrementalDetokenizer

# Greedy output of the embedded SmolLM2 (transformers, fp32) for the chat prompt
# "Translate to Chinese: I love you 🎉", 40 tokens: CJK and emoji split across tokens, ending
# inside an emoji.
RECORDED_GENERATION = [
    177, 222, 227, 177, 220, 222, 8083, 219, 10813, 232, 227, 10813, 232, 227, 10813, 232, 227,
    10813, 232, 227, 10813, 232, 227, 10813, 232, 227, 10813, 232, 227, 10813, 232, 227, 10813,
    232, 227, 10813, 232, 227, 10813, 232,
]


def stream(tokenizer, prompt_ids, output_ids, skip_special_tokens=True) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
    return [detok.push(t) for t in output_ids] + [detok.flush()]


def chat_prompt(tokenizer) -> list[int]:
    return tokenizer.apply_chat_template([ChatMessage("user", "Translate to Chinese: I love you 🎉")])


def test_recorded_generation_streams_whole_characters(smol):
    pieces = stream(smol, chat_prompt(smol), RECORDED_GENERATION)
    assert "".join(pieces) == smol.decode(RECORDED_GENERATION)
    assert "".join(pieces).startswith("愉悄！🎉🎉")
    assert all("\ufffd" not in piece for piece in pieces[:-1])
    assert pieces[-1] == "\ufffd"
    assert pieces.count("") > 10


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_encoded_text_streams_back_exactly(smol, text):
    ids = smol.encode(text)
    pieces = stream(smol, chat_prompt(smol), ids, skip_special_tokens=False)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_each_emoji_appears_only_when_complete(smol):
    ids = smol.encode("🎉")
    assert len(ids) > 1
    detok = IncrementalDetokenizer(smol, [])
    assert [detok.push(t) for t in ids] == [""] * (len(ids) - 1) + ["🎉"]


def _random_id(rng: random.Random, tokenizer) -> list[int]:
    """Random ids biased to single-byte tokens (ids 17..272 hold SmolLM2's byte alphabet and
    other short pieces) so that characters are often cut, plus some special tokens."""
    pick = rng.random()
    if pick < 0.4:
        return rng.randrange(17, 273)
    if pick < 0.5:
        return rng.randrange(0, 17)
    return rng.randrange(tokenizer.vocab_size)


@pytest.mark.parametrize("skip", [True, False])
def test_random_sequences_concatenate_to_decode(smol, skip):
    rng = random.Random(1234)
    for _ in range(300):
        output = [_random_id(rng, smol) for _ in range(rng.randrange(1, 30))]
        prompt = [_random_id(rng, smol) for _ in range(rng.randrange(0, 8))]
        pieces = stream(smol, prompt, output, skip_special_tokens=skip)
        assert "".join(pieces) == smol.decode(output, skip_special_tokens=skip)


def test_random_byte_runs_never_split_a_character(smol):
    """Valid UTF-8 cut into random token runs: every piece is whole characters."""
    rng = random.Random(99)
    text = "".join(VARIED_TEXTS)
    for _ in range(50):
        start = rng.randrange(len(text))
        snippet = text[start : start + rng.randrange(1, 60)]
        ids = [t for chunk in _random_cuts(rng, snippet) for t in smol.encode(chunk)]
        pieces = stream(smol, [], ids)
        assert "".join(pieces) == smol.decode(ids)
        assert all("\ufffd" not in piece for piece in pieces)


def _random_cuts(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(3, len(text) + 1)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def test_special_tokens_skipped_or_kept(smol):
    output = smol.encode("Paris.<|im_end|>")
    assert "".join(stream(smol, [], output, skip_special_tokens=True)) == "Paris."
    assert "".join(stream(smol, [], output, skip_special_tokens=False)) == "Paris.<|im_end|>"


def test_flush_twice_and_output_ids(smol):
    detok = IncrementalDetokenizer(smol, [])
    ids = smol.encode("ok 🎉")
    text = "".join(detok.push(t) for t in ids)
    assert text == "ok 🎉" and detok.flush() == "" and detok.flush() == ""
    assert detok.output_ids == ids


def test_prompt_ending_inside_a_character_is_not_used_as_context(smol):
    emoji = smol.encode("🎉")
    prompt = smol.encode("hi ") + emoji[:1]
    output = smol.encode(" done")
    assert "".join(stream(smol, prompt, output)) == " done"


def test_spm_keeps_the_space_before_the_first_word(spm):
    prompt = spm.encode("The capital of")
    output = spm.encode(" France 🇫🇷 is Paris", add_special_tokens=False)
    pieces = stream(spm, prompt, output)
    full = spm.decode(prompt + output)
    assert "".join(pieces) == full[len(spm.decode(prompt)) :]
    assert "".join(pieces).startswith(" France")
    assert all("\ufffd" not in piece for piece in pieces)
