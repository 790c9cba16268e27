"""Token ids in, text deltas out, for one request: streaming detokenisation plus stop strings.

Work per push, not per token: the tokens of a push are decoded together and their text checked
for stop strings once. A push in which a stop string ends the text is replayed token by token
(once per request) to say which token completed it, so that what a caller gets does not depend
on how the tokens were grouped.

Used by the in-process LLM API and by the router (workers speak token ids only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pdserve.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer


class TextDelta(NamedTuple):  # (a tuple: one per message the router relays, made in a fraction of a dataclass's time)
    text: str
    stopped: bool  # a stop string matched: the request ends here, `text` ends before it
    tokens: int  # how many of the pushed tokens count: all, or (stopped) up to the one that completed the stop


class TextStream:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stops: Sequence[str]):
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = StopStringMatcher(stops)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def push(self, token_ids: Sequence[int]) -> TextDelta:
        if self._stops.empty:  # nothing to check: no marks, no replay
            return TextDelta(self._detok.push_many(token_ids), False, len(token_ids))
        marks = self._detok.mark(), self._stops.mark()
        emit, stopped = self._stops.feed(self._detok.push_many(token_ids))
        if not stopped or len(token_ids) == 1:
            return TextDelta(emit, stopped, len(token_ids))
        self._detok.rewind(marks[0])
        self._stops.rewind(marks[1])
        return self._push_each(token_ids)

    def _push_each(self, token_ids: Sequence[int]) -> TextDelta:
        pieces = []
        for count, token in enumerate(token_ids, 1):
            emit, stopped = self._stops.feed(self._detok.push(token))
            pieces.append(emit)
            if stopped:
                return TextDelta("".join(pieces), True, count)
        return TextDelta("".join(pieces), False, len(token_ids))

    def finish(self) -> str:
        """Text held back at the end of a request that did not stop on a string."""
        if self._stops.stopped:
            return ""
        emit, _ = self._stops.feed(self._detok.flush())
        return emit + self._stops.flush()
