"""SentencePiece vocabularies in GGUF (`tokenizer.ggml.model == "llama"`: Llama 2, Mistral up to
v0.3, TinyLlama, Gemma), tokenised as llama.cpp's `llm_tokenizer_spm` does.

    raw text --(control / user-defined tokens cut out whole)--> pieces
    piece --(" " before it if `add_space_prefix`; every " " as "▁")--> one word, no further split
    word --(UTF-8 characters; repeatedly join the adjacent pair whose joined text is the
            best-scored vocabulary entry, leftmost on ties)--> entries, or <0xNN> bytes for a
            character the vocabulary lacks

That is BPE whose merges are every (left, right) pair of entries that joins into an entry, ranked
by the joined entry's score, which `tokenizers` runs at native speed. NOTE: llama.cpp breaks a tie
between two equally scored joins by position; here the rank decides, so the two agree only where
scores are distinct per entry (as in Llama 2 and Gemma vocabularies) or the tied joins never meet.
"""

from __future__ import annotations

from typing import Any

from tokenizers import decoders, models, normalizers
from tokenizers import Tokenizer as Backend

from pdserve.tokenizer.gguf_vocab import add_whole_tokens, post_processor

SPACE = "\u2581"

SPM_DEFAULTS = {
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.unknown_token_id": 0,
    "tokenizer.ggml.add_space_prefix": True,
}
"""llama.cpp's values for an SPM vocabulary whose file leaves them out (BOS is also added by default)."""


def score_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every (left, right) pair of entries that joins into an entry, best-scored join first."""
    index = {token: i for i, token in enumerate(tokens)}
    ranked = []
    for token, score in zip(tokens, scores):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in index and right in index:
                ranked.append((-score, index[token], cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _normalizer(add_space_prefix: bool) -> normalizers.Normalizer:
    """llama.cpp's `llama_escape_whitespace`, after a leading space when the file asks for one.

    NOTE: `tokenizers` normalises each piece between added tokens on its own, which is where
    llama.cpp adds the prefix too (at the start and after every special or user-defined token).
    """
    escape = normalizers.Replace(" ", SPACE)
    return normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if add_space_prefix else escape


def _decoder(add_space_prefix: bool) -> decoders.Decoder:
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


def spm_backend(meta: dict[str, Any]) -> Backend:
    """An SPM backend from `tokenizer.ggml.{tokens,scores,token_type}` (meta with SPM_DEFAULTS)."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    scores: list[float] = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {token: index for index, token in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
    model = models.BPE(vocab=vocab, merges=score_merges(tokens, scores), unk_token=unk,
                       byte_fallback=True, fuse_unk=False)
    backend = Backend(model)
    add_space_prefix = bool(meta["tokenizer.ggml.add_space_prefix"])
    backend.normalizer = _normalizer(add_space_prefix)
    backend.decoder = _decoder(add_space_prefix)
    backend.post_processor = post_processor(meta, add_bos_default=True)
    add_whole_tokens(backend, meta, lambda token: True)
    return backend
