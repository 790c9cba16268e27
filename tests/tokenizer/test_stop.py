"""Stop strings over a stream fed in arbitrary pieces."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pdserve.tokenizer import StopResult, StopStringMatcher


def run(stops, pieces) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    out = []
    for piece in pieces:
        result = matcher.feed(piece)
        out.append(result.emit)
        if result.stopped:
            return "".join(out), True
    tail = matcher.flush()
    return "".join(out) + tail, matcher.stopped


def expected(stops, text) -> tuple[str, bool]:
    hits = [text.find(s) for s in stops if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def test_stop_split_across_pushes():
    matcher = StopStringMatcher(["\n\nUser"])
    assert matcher.feed("The answer is 4") == StopResult("The answer is 4", False)
    assert matcher.feed("2.\n") == StopResult("2.", False)
    assert matcher.feed("\nUs") == StopResult("", False)
    assert matcher.feed("er: more") == StopResult("", True)
    assert matcher.stopped
    assert matcher.feed("anything") == StopResult("", True)
    assert matcher.flush() == ""


def test_false_start_is_released():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("a ST") == StopResult("a ", False)
    assert matcher.feed("OR") == StopResult("STOR", False)
    assert matcher.feed("E ST") == StopResult("E ", False)
    assert matcher.flush() == "ST"


def test_earliest_of_several_stops_wins():
    assert run(["world", "lo w"], ["hel", "lo world"]) == ("hel", True)
    assert run(["abc", "b"], ["ab", "c"]) == ("", True)  # "abc" starts first


def test_stop_inside_one_piece_and_at_the_start():
    assert run(["."], ["Paris. Next"]) == ("Paris", True)
    assert run(["Paris"], ["Paris is"]) == ("", True)


def test_no_stops_passes_everything_through():
    matcher = StopStringMatcher([])
    assert matcher.feed("abc") == StopResult("abc", False)
    assert matcher.flush() == ""


def test_unicode_stop():
    assert run(["🎉"], ["日本", "語 🎉 no"]) == ("日本語 ", True)


@pytest.mark.parametrize("bad", [[""], ["ok", ""]])
def test_empty_stop_string_rejected(bad):
    with pytest.raises(ValueError, match="empty"):
        StopStringMatcher(bad)


def test_non_string_stop_rejected():
    with pytest.raises(ValueError, match="must be a string"):
        StopStringMatcher([3])


@settings(max_examples=300, deadline=None, derandomize=True)  # CI sees the same examples every run
@given(
    text=st.text(alphabet="ab\nc", max_size=40),
    stops=st.lists(st.text(alphabet="ab\nc", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
@example(text="\naa", stops=["a", "\naa"], cuts=[2])  # a longer stop starting earlier wins
def test_any_split_gives_the_one_shot_answer(text, stops, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert run(stops, pieces) == expected(stops, text)


def test_a_match_waits_while_an_earlier_longer_stop_is_undecided():
    matcher = StopStringMatcher(["a", "\naa"])
    assert matcher.feed("\na") == StopResult("", False)
    assert matcher.feed("b") == StopResult("\n", True)


def test_a_stop_held_at_the_end_of_the_stream_is_cut_by_flush():
    matcher = StopStringMatcher(["a", "\naa"])
    assert matcher.feed("\na") == StopResult("", False)
    assert matcher.flush() == "\n"
    assert matcher.stopped
