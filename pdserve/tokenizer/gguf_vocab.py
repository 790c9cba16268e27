"""What every GGUF vocabulary kind shares: token types, whole-matched tokens, BOS/EOS wrapping."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as Backend


class TokenType(enum.IntEnum):
    """`tokenizer.ggml.token_type` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


def add_whole_tokens(backend: Backend, meta: dict[str, Any], keep_control: Callable[[str], bool]) -> None:
    """Control and unknown tokens as special tokens, user-defined ones as plain added tokens.

    Both are matched whole in the raw text before anything else, as llama.cpp's
    `tokenizer_st_partition` does (user-defined ones even when special tokens are not parsed);
    only special ones are left out by `decode(..., skip_special_tokens=True)`.
    `keep_control` drops control tokens a vocabulary kind cannot hold.
    """
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type", [])
    special, plain = [], []
    for token, kind in zip(tokens, types):
        if kind in (TokenType.CONTROL, TokenType.UNKNOWN) and keep_control(token):
            special.append(AddedToken(token, special=True, normalized=False))
        elif kind == TokenType.USER_DEFINED:
            plain.append(AddedToken(token, special=False, normalized=False))
    backend.add_special_tokens(special)
    backend.add_tokens(plain)


def _wrapping_token(meta: dict[str, Any], flag: str, default: bool, key: str) -> list[tuple[str, int]]:
    """[(token, id)] when the file (or llama.cpp's default for its kind) asks for this token around
    every encoding, else []."""
    token_id = meta.get(f"tokenizer.ggml.{key}")
    if not meta.get(f"tokenizer.ggml.{flag}", default) or token_id is None:
        return []
    return [(meta["tokenizer.ggml.tokens"][token_id], token_id)]


def post_processor(meta: dict[str, Any], add_bos_default: bool) -> processors.TemplateProcessing:
    """BOS / EOS around an encoding as `tokenizer.ggml.add_{bos,eos}_token` ask; where the file is
    silent, BOS as llama.cpp's default for the vocabulary kind and no EOS."""
    bos = _wrapping_token(meta, "add_bos_token", add_bos_default, "bos_token_id")
    eos = _wrapping_token(meta, "add_eos_token", False, "eos_token_id")
    single = [*(t for t, _ in bos), "$A", *(t for t, _ in eos)]
    pair = [*single, *(t for t, _ in bos), "$B:1", *(t for t, _ in eos)]
    specials = list(dict.fromkeys(bos + eos))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
