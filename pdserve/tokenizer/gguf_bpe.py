"""Byte-level BPE from a GGUF vocabulary (`tokenizer.ggml.model == "gpt2"`), as llama.cpp runs it.

    raw text --(control / user-defined tokens cut out whole)--> pieces
    piece --(the pre type's regexes, in turn; gguf_pre.py)--> words --(bytes as printable chars)-->
    word --(merges by rank, leftmost first; `ignore_merges`: a word in the vocabulary is one token)--> ids

Vocabulary entries are looked up as the file spells them, as llama.cpp does.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from pdserve.tokenizer.gguf_pre import PreSplit
from pdserve.tokenizer.gguf_vocab import add_whole_tokens, post_processor


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


def pre_tokenizer(split: PreSplit, vocab: dict[str, int]) -> pre_tokenizers.PreTokenizer:
    """The split's regexes in turn (each match and each gap between matches a piece), then bytes.

    NOTE: a byte the vocabulary has no entry for is dropped, and no merge joins across it: llama.cpp
    keeps it as a symbol that never merges and emits nothing for it (SmolLM2 lacks 0x04, 0xF1, ...).
    """
    steps = [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in split.regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    missing = "".join(f"\\x{{{ord(ch):X}}}" for ch in byte_alphabet() if ch not in vocab)
    if missing:
        steps.append(pre_tokenizers.Split(Regex(f"[{missing}]"), behavior="removed"))
    return pre_tokenizers.Sequence(steps)


def _merge_pair(merge: str) -> tuple[str, str]:
    """'left right' split at the first space after the first character, as llama.cpp splits it."""
    cut = merge.find(" ", 1)
    return merge[:cut], merge[cut + 1:]


def byte_level_backend(meta: dict[str, Any], split: PreSplit) -> Backend:
    """A byte-level BPE backend from `tokenizer.ggml.{tokens,merges,token_type}` and the pre type."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [_merge_pair(m) for m in meta.get("tokenizer.ggml.merges", []) if m.find(" ", 1) > 0]
    model = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                       ignore_merges=split.ignore_merges)
    backend = Backend(model)
    backend.pre_tokenizer = pre_tokenizer(split, vocab)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = post_processor(meta, split.add_bos)
    alphabet = frozenset(byte_alphabet())
    add_whole_tokens(backend, meta, lambda token: set(token) <= alphabet)
    return backend
