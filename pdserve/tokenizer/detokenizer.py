"""Streaming detokenisation: one token in, only new complete text out.

Each push decodes a short window instead of the whole output:

    ids:   ... | prefix_offset ........ read_offset ........ len(ids)
                 |<- already emitted ->|<- not yet emitted ->|
    new text = decode(ids[prefix:]) minus decode(ids[prefix:read])

The window is emitted only when its text does not end in U+FFFD, i.e. when the bytes so far end
on a complete character; a character split across tokens is held back until its last byte comes.
`read_offset` therefore always sits on a character boundary, so decoding from there is exact.

NOTE: for byte-level tokenizers the concatenation of every `push` and the final `flush` equals
`decode(output_ids)`. The window starts with a few prompt tokens as context; for decoders that
strip a leading space (SentencePiece style) this keeps the space before the first output word,
as `decode(prompt + output)` would.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.tokenizer.base import Tokenizer

_CONTEXT_TOKENS = 4
_REPLACEMENT = "\ufffd"


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
        self._ids.append(token_id)
        self._output_ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Text still held back at the end of the stream (an unfinished character as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        window = self._ids[self._prefix_offset :]
        before = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(window)
        if len(text) <= len(before) or (text.endswith(_REPLACEMENT) and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return text[len(before) :]
