"""Stop strings over a text stream.

The matcher keeps back the longest tail of the text that could still grow into a stop string,
so a stop string split across pieces is found and never half-emitted; each piece is searched with
that tail only (the new text plus at most the longest stop string's length), never the text before:

    fed:   "The answer is 4" | "2.\\n\\nUser"        stops = ("\\n\\nUser",)
    emit:  "The answer is 4"  | "2."   stopped        (the stop string itself is never emitted)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StopResult(NamedTuple):
    """`emit`: text safe to send now. `stopped`: a stop string was found; `emit` ends just
    before it and everything after it is dropped."""

    emit: str
    stopped: bool


def validate_stop_strings(stops: Sequence[str]) -> tuple[str, ...]:
    """The stop strings as a tuple; ValueError for an empty or non-string one."""
    for index, stop in enumerate(stops):
        if not isinstance(stop, str):
            raise ValueError(f"stop string {index} must be a string, got {type(stop).__name__}")
        if not stop:
            raise ValueError(f"stop string {index} is empty; an empty stop string would match at once")
    return tuple(stops)


class StopMark(NamedTuple):
    """Where a matcher stood (`mark`), to go back to (`rewind`)."""

    held: str
    stopped: bool


class StopStringMatcher:
    """Finds the earliest stop string in a stream fed piece by piece. One per request."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = validate_stop_strings(stops)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def empty(self) -> bool:
        """No stop strings: nothing fed ever stops the stream."""
        return not self._stops

    def mark(self) -> StopMark:
        return StopMark(self._held, self._stopped)

    def rewind(self, mark: StopMark) -> None:
        """Back to where `mark` was taken: the text fed since is forgotten."""
        self._held, self._stopped = mark

    def feed(self, text: str) -> StopResult:
        """Add the next piece of the stream. After a stop, every feed returns ("", True)."""
        if self._stopped or not self._stops:
            return StopResult("" if self._stopped else text, self._stopped)
        buffer = self._held + text
        match = self._earliest_match(buffer)
        keep = self._partial_tail(buffer)
        undecided = len(buffer) - keep  # a stop string may still start here and end later
        if match is not None and match <= undecided:
            self._stopped = True
            self._held = ""
            return StopResult(buffer[:match], True)
        self._held = buffer[undecided:]
        return StopResult(buffer[:undecided], False)

    def flush(self) -> str:
        """The held-back tail at the end of the stream, cut before a stop string it holds
        (which then counts as a stop)."""
        held, self._held = self._held, ""
        if self._stopped:
            return ""
        match = self._earliest_match(held)
        if match is None:
            return held
        self._stopped = True
        return held[:match]

    def _earliest_match(self, buffer: str) -> int | None:
        positions = [p for p in (buffer.find(stop) for stop in self._stops) if p >= 0]
        return min(positions) if positions else None

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        last = buffer[-1:]
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if stop[size - 1] == last and buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
