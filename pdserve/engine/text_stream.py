"""Token ids in, text deltas out, for one request: streaming detokenisation plus stop strings.

Used by the in-process LLM API and by the router (workers speak token ids only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.tokenizer import IncrementalDetokenizer, StopStringMatcher, Tokenizer


@dataclass(frozen=True)
class TextDelta:
    text: str
    stopped: bool  # a stop string matched: the request ends here, `text` ends before it


class TextStream:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stops: Sequence[str]):
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = StopStringMatcher(stops)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def push(self, token_ids: Sequence[int]) -> TextDelta:
        pieces = []
        for token in token_ids:
            emit, stopped = self._stops.feed(self._detok.push(token))
            pieces.append(emit)
            if stopped:
                return TextDelta("".join(pieces), True)
        return TextDelta("".join(pieces), False)

    def finish(self) -> str:
        """Text held back at the end of a request that did not stop on a string."""
        if self._stops.stopped:
            return ""
        emit, _ = self._stops.feed(self._detok.flush())
        return emit + self._stops.flush()
