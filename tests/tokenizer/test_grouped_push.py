"""Tokens pushed a step's worth at a time (IncrementalDetokenizer.push_many, TextStream.push):
the same text as one token at a time, whole characters in every piece, and a stop string ending
at the same token whatever the grouping."""

from __future__ import annotations

import random

import pytest
from tests.tokenizer.test_detokenizer import RECORDED_GENERATION, chat_prompt
from tests.tokenizer.texts import VARIED_TEXTS

from pdserve.engine.text_stream import TextStream
from pdserve.tokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.timeout(120)


def _groups(rng: random.Random, ids: list[int]) -> list[list[int]]:
    groups, at = [], 0
    while at < len(ids):
        size = rng.randrange(1, 9)
        groups.append(ids[at:at + size])
        at += size
    return groups


def _grouped(tokenizer, prompt, groups) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    return [detok.push_many(g) for g in groups] + [detok.flush()]


@pytest.mark.parametrize("seed", range(4))
def test_groups_stream_the_same_text_in_whole_characters(smol, seed):
    rng = random.Random(seed)
    prompt = chat_prompt(smol)
    for ids in [RECORDED_GENERATION, *(smol.encode(t) for t in VARIED_TEXTS if t)]:
        pieces = _grouped(smol, prompt, _groups(rng, ids))
        assert "".join(pieces) == smol.decode(ids)
        assert all("\ufffd" not in piece for piece in pieces[:-1])


def test_a_group_ending_inside_a_character_sends_the_characters_before_it(smol):
    emoji = smol.encode("🎉")
    ids = smol.encode("ok") + emoji[:-1]
    detok = IncrementalDetokenizer(smol, [])
    assert detok.push_many(ids) == "ok"
    assert detok.push_many(emoji[-1:]) == "🎉"


def _stream(tokenizer, prompt, groups, stops) -> tuple[str, bool, int]:
    text, taken = TextStream(tokenizer, prompt, stops), 0
    pieces = []
    for group in groups:
        delta = text.push(group)
        pieces.append(delta.text)
        taken += delta.tokens
        if delta.stopped:
            return "".join(pieces), True, taken
    return "".join(pieces) + text.finish(), False, taken


@pytest.mark.parametrize("seed", range(4))
def test_a_stop_string_ends_at_the_same_token_in_any_grouping(smol, seed):
    rng = random.Random(seed)
    prompt = chat_prompt(smol)
    for source in VARIED_TEXTS:
        ids = smol.encode(source)
        full = smol.decode(ids)
        if len(full.strip()) < 6:
            continue
        start = rng.randrange(len(full) - 3)
        stops = (full[start:start + rng.randrange(1, 4)], "never there")
        one_by_one = _stream(smol, prompt, [[t] for t in ids], stops)
        assert _stream(smol, prompt, _groups(rng, ids), stops) == one_by_one
        assert one_by_one[:2] == (full[:full.index(stops[0])], True)


@pytest.mark.parametrize("seed", range(4))
def test_the_text_out_after_each_token_is_the_same_however_the_tokens_were_grouped(smol, seed):
    """So a stream continued elsewhere after k tokens (pushed there at once) goes on where its text
    was: bytes that never form a character (a random model's) included."""
    rng = random.Random(seed)
    byte_tokens = [t for t in range(smol.vocab_size) if smol.decode([t]) == "\ufffd"][:40]
    ids = [rng.choice(byte_tokens) if rng.random() < 0.85 else rng.randrange(300, 2000) for _ in range(160)]
    prompt = chat_prompt(smol)
    for cut in (17, 80, 159):
        one = IncrementalDetokenizer(smol, prompt)
        by_one = "".join(one.push(t) for t in ids[:cut])
        grouped = IncrementalDetokenizer(smol, prompt)
        by_groups = "".join(grouped.push_many(g) for g in _groups(rng, ids[:cut]))
        at_once = IncrementalDetokenizer(smol, prompt)
        assert at_once.push_many(ids[:cut]) == by_groups == by_one
        assert by_one + one.push_many(ids[cut:]) + one.flush() == smol.decode(ids)


class _Counting:
    """A tokenizer whose decodes count the ids they were given."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("group", [1, 7, 64])
def test_bytes_that_never_form_a_character_cost_a_bounded_window(smol, group):
    """A random model's stream of lone continuation bytes: text goes out as it comes (never all held
    to the end), and the ids decoded grow with the stream's length, not its square."""
    rng = random.Random(group)
    byte_tokens = [t for t in range(smol.vocab_size) if smol.decode([t]) == "\ufffd"]
    pairs = {t: smol.decode([t, byte_tokens[0]]) for t in byte_tokens}
    lead = next(t for t, text in pairs.items() if len(text) == 1 and text != "\ufffd")  # one char of two bytes
    byte_tokens = [t for t in byte_tokens if "\ufffd" not in smol.decode([lead, t])]  # continuation bytes
    ids = [rng.choice(byte_tokens) for _ in range(3000)]
    counting = _Counting(smol)
    detok = IncrementalDetokenizer(counting, [])
    pieces = [detok.push_many(ids[at:at + group]) for at in range(0, len(ids), group)]
    tail = detok.flush()
    assert "".join(pieces) + tail == smol.decode(ids)
    assert len(tail) < 8  # at most the tokens since the last character end, or the last three
    assert counting.decoded < 40 * len(ids)
