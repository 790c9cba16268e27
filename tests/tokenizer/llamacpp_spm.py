"""A line-by-line Python port of llama.cpp's SPM tokenizer (src/llama-vocab.cpp,
`llm_tokenizer_spm_session` and the SPM branch of `impl::tokenize`), slow but plain: the oracle the
fast GGUF tokenizer is checked against on text the reference data does not hold."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

SPACE = "\u2581"


@dataclass
class _Symbol:
    text: str  # one UTF-8 character at first, the joined text after merges ("" once merged away)
    prev: int
    next: int


class LlamaCppSpm:
    """Token ids of text, for a vocabulary given as tokens and scores."""

    def __init__(self, tokens: list[str], scores: list[float], add_space_prefix: bool) -> None:
        self._ids = {token: i for i, token in enumerate(tokens)}
        self._scores = scores
        self._add_space_prefix = add_space_prefix

    def encode_piece(self, text: str, prefix: bool) -> list[int]:
        """One raw-text fragment (between whole-matched tokens); `prefix`: it comes first or after one."""
        if self._add_space_prefix and prefix:
            text = " " + text
        return self._tokenize(text.replace(" ", SPACE))

    def _tokenize(self, text: str) -> list[int]:
        symbols = [_Symbol(ch, i - 1, i + 1 if i + 1 < len(text) else -1) for i, ch in enumerate(text)]
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, joined length)
        for i in range(1, len(symbols)):
            self._push(symbols, queue, i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            a, b = symbols[left], symbols[right]
            if not a.text or not b.text or len(a.text) + len(b.text) != size:
                continue
            a.text, b.text = a.text + b.text, ""
            a.next = b.next
            if b.next >= 0:
                symbols[b.next].prev = left
            self._push(symbols, queue, a.prev, left)
            self._push(symbols, queue, left, a.next)
        out: list[int] = []
        i = 0 if symbols else -1
        while i != -1:
            out.extend(self._resegment(symbols[i].text))
            i = symbols[i].next
        return out

    def _push(self, symbols: list[_Symbol], queue: list, left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        joined = symbols[left].text + symbols[right].text
        token = self._ids.get(joined)
        if token is not None:
            heapq.heappush(queue, (-self._scores[token], left, right, len(joined)))

    def _resegment(self, text: str) -> list[int]:
        token = self._ids.get(text)
        if token is not None:
            return [token]
        return [self._ids[f"<0x{b:02X}>"] for b in text.encode("utf-8")]


def partition(text: str, whole: dict[str, int]) -> list[str | int]:
    """llama.cpp's `tokenizer_st_partition`: each whole-matched token, longest first, cut out of every
    raw fragment left, left to right."""
    fragments: list[str | int] = [text] if text else []
    for token in sorted(whole, key=len, reverse=True):
        fragments = [part for fragment in fragments for part in _cut(fragment, token, whole[token])]
    return fragments


def _cut(fragment: str | int, token: str, token_id: int) -> list[str | int]:
    if isinstance(fragment, int) or token not in fragment:
        return [fragment]
    parts: list[str | int] = []
    for i, raw in enumerate(fragment.split(token)):
        if i:
            parts.append(token_id)
        if raw:
            parts.append(raw)
    return parts


def encode(spm: LlamaCppSpm, text: str, whole: dict[str, int]) -> list[int]:
    """`llama_tokenize(text, add_special=False, parse_special=...)` where `whole` holds the tokens
    cut out first (user-defined ones; control ones too when special tokens are parsed)."""
    out: list[int] = []
    prefix = True
    for fragment in partition(text, whole):
        if isinstance(fragment, int):
            out.append(fragment)
        else:
            out.extend(spm.encode_piece(fragment, prefix))
        prefix = isinstance(fragment, int)
    return out
