"""Prompt parts to token ids in one pass, so joins between parts tokenise as in one text.

A copy of the backend reads every special-token string as text. Each special part is written as
a stand-in: an added, non-special token with the special token's matching rules (strip, single
word, normalisation) and a random spelling no message can contain. Added tokens split the text
before normalisation and pre-tokenisation, so the stand-ins cut the text exactly where the special
tokens would; their ids are then swapped for the special tokens' ids:

    parts    <|im_start|> | "user\\nhi <|im_start|>" | <|im_end|>
    copy     S1 "user\\nhi <|im_start|>" S2            (S1, S2: stand-ins; the inner string is text)
    ids      [1, 4093, 198, 6004, 2067, 108, 306, 79, 3738, 108, 46, 2]     (SmolLM2)
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from pdserve.tokenizer.chat_specials import PromptPart


def _stand_in(tag: str, token_id: int, special: AddedToken) -> AddedToken:
    return AddedToken(
        f"\U000f0000{tag}:{token_id}\U000f0001",
        single_word=special.single_word,
        lstrip=special.lstrip,
        rstrip=special.rstrip,
        normalized=special.normalized,
        special=False,
    )


class PartsEncoder:
    """Encodes PromptParts for one backend. Immutable after construction; thread-safe."""

    def __init__(self, backend: Backend) -> None:
        self._backend = Backend.from_str(backend.to_str())
        self._backend.encode_special_tokens = True
        tag = secrets.token_hex(12)
        specials = {i: t for i, t in backend.get_added_tokens_decoder().items() if t.special}
        stand_ins = {i: _stand_in(tag, i, t) for i, t in specials.items()}
        self._backend.add_tokens(list(stand_ins.values()))
        self._spelling = {specials[i].content: s.content for i, s in stand_ins.items()}
        self._to_special = {self._backend.token_to_id(s.content): i for i, s in stand_ins.items()}

    def encode(self, parts: Sequence[PromptPart]) -> list[int]:
        """Special parts as their special token; text parts with special strings as plain text."""
        text = "".join(self._spelling[p.text] if p.special else p.text for p in parts)
        ids = self._backend.encode(text, add_special_tokens=False).ids
        return [self._to_special.get(i, i) for i in ids]
