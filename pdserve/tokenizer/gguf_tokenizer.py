"""A Tokenizer built from a GGUF file's metadata (`tokenizer.ggml.*`).

Supported: byte-level BPE (`tokenizer.ggml.model == "gpt2"`), the kind Llama-3, Qwen, SmolLM
and GPT-2 style models use. Other kinds raise UnsupportedTokenizerError.

NOTE: the text split before BPE comes from `tokenizer.ggml.pre`; names not in
`PRE_TOKENIZER_SPLITS` use the GPT-2 split, which is also what the reference loader does.
"""

from __future__ import annotations

import enum
from functools import cache
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from pdserve.tokenizer.base import UnsupportedTokenizerError
from pdserve.tokenizer.chat_template import ChatTemplate
from pdserve.tokenizer.fast import FastTokenizer, SpecialTokens
from pdserve.tokenizer.gguf_metadata import read_gguf_metadata

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


class TokenType(enum.IntEnum):
    """`tokenizer.ggml.token_type` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@cache
def byte_alphabet() -> tuple[str, ...]:
    """The printable character byte-level BPE writes for each byte value 0..255.

    Printable Latin-1 bytes stand for themselves; the other 68 take code points 256, 257, ...
    in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    keep = set(printable)
    extra = iter(range(256, 256 + 256 - len(keep)))
    return tuple(chr(b) if b in keep else chr(next(extra)) for b in range(256))


def _spelled(token: str, alphabet: frozenset[str]) -> str:
    """A vocabulary entry in the byte alphabet (some files store raw UTF-8 for a few)."""
    if set(token) <= alphabet:
        return token
    table = byte_alphabet()
    return "".join(table[b] for b in token.encode("utf-8"))


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    split = PRE_TOKENIZER_SPLITS.get(pre or "")
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _added_tokens(tokens: list[str], types: list[int], alphabet: frozenset[str]) -> list[AddedToken]:
    """Control tokens as special, user-defined ones as plain added tokens (both matched whole).

    A control token spelled outside the byte alphabet is a mislabelled entry and is skipped.
    """
    added = []
    for token, kind in zip(tokens, types):
        if kind == TokenType.CONTROL and set(token) <= alphabet:
            added.append(AddedToken(token, special=True, normalized=False))
        elif kind == TokenType.USER_DEFINED:
            added.append(AddedToken(token, special=False, normalized=False))
    return added


def _wrapping_token(meta: dict[str, Any], flag: str, key: str, tokens: list[str]) -> list[tuple[str, int]]:
    """[(token, id)] when the file asks for this token around every encoding, else []."""
    token_id = meta.get(f"tokenizer.ggml.{key}")
    if not meta.get(f"tokenizer.ggml.{flag}", False) or token_id is None:
        return []
    return [(tokens[token_id], token_id)]


def _post_processor(meta: dict[str, Any], tokens: list[str]) -> processors.TemplateProcessing:
    """BOS / EOS around an encoding as `tokenizer.ggml.add_{bos,eos}_token` ask."""
    bos = _wrapping_token(meta, "add_bos_token", "bos_token_id", tokens)
    eos = _wrapping_token(meta, "add_eos_token", "eos_token_id", tokens)
    single = [*(t for t, _ in bos), "$A", *(t for t, _ in eos)]
    pair = [*single, *(t for t, _ in bos), "$B:1", *(t for t, _ in eos)]
    specials = list(dict.fromkeys(bos + eos))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def byte_level_backend(meta: dict[str, Any]) -> Backend:
    """A byte-level BPE backend from `tokenizer.ggml.{tokens,merges,token_type,pre}`."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    alphabet = frozenset(byte_alphabet())
    vocab = {_spelled(token, alphabet): index for index, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = _post_processor(meta, tokens)
    types = meta.get("tokenizer.ggml.token_type", [])
    backend.add_special_tokens(_added_tokens(tokens, types, alphabet))
    return backend


def gguf_special_tokens(meta: dict[str, Any]) -> SpecialTokens:
    """BOS and every end-of-generation id (EOS, end-of-turn, end-of-message)."""
    eos = [meta.get(f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    return SpecialTokens(
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(i for i in eos if i is not None)),
    )


class GGUFTokenizer(FastTokenizer):
    """The tokenizer a GGUF file describes."""

    def __init__(self, path: str) -> None:
        meta = read_gguf_metadata(path)
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise UnsupportedTokenizerError(
                f"{path}: tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')"
            )
        source = meta.get("tokenizer.chat_template")
        template = ChatTemplate(source) if source else None
        super().__init__(byte_level_backend(meta), gguf_special_tokens(meta), template)
