"""A Tokenizer built from a GGUF file's metadata (`tokenizer.ggml.*`), tokenising as llama.cpp does.

Supported `tokenizer.ggml.model` kinds:
  "gpt2"   byte-level BPE (Llama 3, Qwen, SmolLM, GPT-2 style), split per `tokenizer.ggml.pre`
           as llama.cpp splits it (gguf_pre.py; a pre name not implemented is refused at load)
  "llama"  SentencePiece (Llama 2, Mistral up to v0.3, TinyLlama, Gemma): gguf_spm.py
Other kinds raise UnsupportedTokenizerError.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer as Backend

from pdserve.checkpoint.gemma3_config import gguf_end_ids
from pdserve.tokenizer.base import UnsupportedTokenizerError
from pdserve.tokenizer.chat_fallback import gguf_chat_template
from pdserve.tokenizer.fast import FastTokenizer, SpecialTokens
from pdserve.tokenizer.gguf_bpe import byte_alphabet, byte_level_backend
from pdserve.tokenizer.gguf_metadata import read_gguf_metadata
from pdserve.tokenizer.gguf_pre import pre_split
from pdserve.tokenizer.gguf_spm import SPM_DEFAULTS, spm_backend
from pdserve.tokenizer.gguf_vocab import TokenType

__all__ = ["GGUFTokenizer", "TokenType", "byte_alphabet", "gguf_backend", "gguf_special_tokens"]


def gguf_backend(meta: dict[str, Any], path: str = "") -> Backend:
    """The `tokenizers` backend for a GGUF file's vocabulary (meta as gguf_metadata reads it)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        return byte_level_backend(meta, pre_split(meta.get("tokenizer.ggml.pre"), path))
    if kind == "llama":
        return spm_backend(meta)
    raise UnsupportedTokenizerError(
        f"{path}: tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2' and SentencePiece 'llama')"
    )


def gguf_special_tokens(meta: dict[str, Any]) -> SpecialTokens:
    """BOS and every end-of-generation id (EOS, end-of-turn, end-of-message; Gemma 3's <end_of_turn>)."""
    eos = [meta.get(f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    return SpecialTokens(
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=gguf_end_ids(meta, tuple(dict.fromkeys(i for i in eos if i is not None))),
    )


def _with_kind_defaults(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata with llama.cpp's defaults for its vocabulary kind where the file is silent."""
    if meta.get("tokenizer.ggml.model") != "llama":
        return meta
    size = len(meta.get("tokenizer.ggml.tokens", []))
    defaults = {k: v for k, v in SPM_DEFAULTS.items() if not k.endswith("_id") or v < size}
    return {**defaults, **meta}


class GGUFTokenizer(FastTokenizer):
    """The tokenizer a GGUF file describes."""

    def __init__(self, path: str) -> None:
        meta = _with_kind_defaults(read_gguf_metadata(path))
        super().__init__(gguf_backend(meta, path), gguf_special_tokens(meta), gguf_chat_template(meta, path))
