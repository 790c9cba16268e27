"""Streaming detokenisation: tokens in (one, or a step's worth), only new complete text out.

Each push decodes a short window instead of the whole output, twice per push whatever the number
of tokens it brings (the tokenizer's native decode does the per-token work):

    ids:   ... | prefix_offset ........ read_offset ........ len(ids)
                 |<- already emitted ->|<- not yet emitted ->|
    new text = decode(ids[prefix:]) minus decode(ids[prefix:read])

The window is emitted only when its text does not end in U+FFFD, i.e. when the bytes so far end
on a complete character; a character split across tokens is held back until its last byte comes
(a push of several tokens emits up to the last one that ends a character: an unfinished one
spans at most three tokens, its first three UTF-8 bytes, so valid text costs at most that many
decodes more). `read_offset` therefore sits on a character boundary, so decoding from there is
exact, and what was emitted after the k-th token is the same however the tokens were grouped into
pushes: a stream continued elsewhere after k tokens (pdserve/reattach.py) goes on exactly where
its text was.

Bytes that never form a character (a random or broken model's) would hold the window forever and
make every push decode it whole, and step back over it token by token: a push looks back at most
`_LONGEST_HOLD` tokens, and a tail that long none of whose tokens ends a character is sent up to
its last three tokens (the bytes of any character still to finish), U+FFFD where it stands. The
point sent to depends on the tokens alone (the last character end is kept across pushes), so the
grouping invariance holds for them too; the cost of a push is bounded by its size plus that hold.

NOTE: for byte-level tokenizers the concatenation of every `push` and the final `flush` equals
`decode(output_ids)`. The window starts with a few prompt tokens as context; for decoders that
strip a leading space (SentencePiece style) this keeps the space before the first output word,
as `decode(prompt + output)` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pdserve.tokenizer.base import Tokenizer

_CONTEXT_TOKENS = 4
_REPLACEMENT = "\ufffd"
_LONGEST_HOLD = 8  # tokens none of which ends a character before the older ones are sent as they stand
_UNFINISHED = 3  # tokens an unfinished character can still be spread over (its first three bytes)


class DetokenizerMark(NamedTuple):
    """Where a detokenizer stood (`mark`), to go back to (`rewind`)."""

    ids: int
    prefix_offset: int
    read_offset: int
    char_end: int


class IncrementalDetokenizer:
    """Per-request streaming decoder. Not thread-safe; one per request."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = self._context(list(prompt_ids[-_CONTEXT_TOKENS:]))
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._char_end = self._read_offset  # the last token that ended a character
        self._output_ids: list[int] = []

    def _context(self, tail: list[int]) -> list[int]:
        """Prompt tokens to decode after, or none when they end inside a character."""
        if tail and self._decode(tail).endswith(_REPLACEMENT):
            return []
        return tail

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    @property
    def output_ids(self) -> list[int]:
        """Every id pushed so far."""
        return list(self._output_ids)

    def push(self, token_id: int) -> str:
        """Add one generated token; the text it completes (possibly empty)."""
        return self.push_many((token_id,))

    def push_many(self, token_ids: Sequence[int]) -> str:
        """Add generated tokens; the text they complete (possibly empty), in one window's decode."""
        pushed_from = len(self._ids)
        self._ids.extend(token_ids)
        self._output_ids.extend(token_ids)
        return self._advance(final=False, shortest=pushed_from + 1)

    def mark(self) -> DetokenizerMark:
        return DetokenizerMark(len(self._ids), self._prefix_offset, self._read_offset, self._char_end)

    def rewind(self, mark: DetokenizerMark) -> None:
        """Back to where `mark` was taken: the tokens pushed since are forgotten."""
        del self._output_ids[len(self._output_ids) - (len(self._ids) - mark.ids):]
        del self._ids[mark.ids:]
        self._prefix_offset, self._read_offset = mark.prefix_offset, mark.read_offset
        self._char_end = mark.char_end

    def flush(self) -> str:
        """Text still held back at the end of the stream (an unfinished character as U+FFFD)."""
        return self._advance(final=True, shortest=len(self._ids))

    def _advance(self, final: bool, shortest: int) -> str:
        """Emits the window up to the last token that ends a character (at `shortest` or after:
        ends before it were tried by earlier pushes), or past a tail that never forms one."""
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        end = len(self._ids)
        text = self._decode(self._ids[self._prefix_offset : end])
        if not final and text.endswith(_REPLACEMENT):
            end, text = self._sendable(end, text, shortest)
        else:
            self._char_end = end
        if len(text) <= len(before):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = end
        return text[len(before) :]

    def _sendable(self, end: int, text: str, shortest: int) -> tuple[int, str]:
        """Where to send to when the window's text ends inside a character: the last token that
        ends one, stepped back to at most `_LONGEST_HOLD` tokens; when the tail since the last
        character end is that long, its older tokens as they stand."""
        last = end
        while text.endswith(_REPLACEMENT) and last > shortest and end - last < _LONGEST_HOLD:
            last -= 1
            text = self._decode(self._ids[self._prefix_offset : last])
        if not text.endswith(_REPLACEMENT):
            self._char_end = last
        if end - self._char_end < _LONGEST_HOLD:
            return (last, text) if last == self._char_end else (self._read_offset, "")
        held_from = max(end - _UNFINISHED, self._read_offset)
        return held_from, self._decode(self._ids[self._prefix_offset : held_from])
