"""A read-only view of a request's first n token ids (prompt then output) without copying both."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.requests import Request


class TokenView(Sequence[int]):
    __slots__ = ("_prompt", "_output", "_len")

    def __init__(self, request: Request, length: int):
        self._prompt = request.prompt_token_ids
        self._output = request.output_token_ids
        self._len = max(0, min(length, len(self._prompt) + len(self._output)))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            assert step == 1, "TokenView slices are contiguous"
            return self._slice(start, stop)
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        split = len(self._prompt)
        return self._prompt[index] if index < split else self._output[index - split]

    def _slice(self, start: int, stop: int) -> list[int]:
        split = len(self._prompt)
        if stop <= split:
            return self._prompt[start:stop]
        if start >= split:
            return self._output[start - split:stop - split]
        return self._prompt[start:] + self._output[:stop - split]
