"""A Tokenizer from a Hugging Face model folder.

Reads `tokenizer.json` (the full pipeline), `tokenizer_config.json` (special token names, chat
template), optionally `chat_template.jinja` (preferred over the config's template) and
`generation_config.json` (extra end-of-generation ids).
"""

from __future__ import annotations

import json
import os
from typing import Any

from tokenizers import Tokenizer as Backend

from pdserve.tokenizer.base import UnsupportedTokenizerError
from pdserve.tokenizer.chat_template import ChatTemplate
from pdserve.tokenizer.fast import FastTokenizer, SpecialTokens


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_name(entry: object) -> str | None:
    """A special token as the config writes it: a string or `{"content": ...}`."""
    if isinstance(entry, dict):
        return entry.get("content")
    return entry if isinstance(entry, str) else None


def _as_ids(value: object) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def hf_special_tokens(backend: Backend, config: dict[str, Any], generation: dict[str, Any]) -> SpecialTokens:
    """BOS from the config; EOS from the config first, then generation_config's ids."""

    def lookup(key: str) -> int | None:
        name = _token_name(config.get(key))
        return backend.token_to_id(name) if name else None

    eos = [lookup("eos_token"), *_as_ids(generation.get("eos_token_id"))]
    bos = lookup("bos_token")
    if bos is None and isinstance(generation.get("bos_token_id"), int):
        bos = generation["bos_token_id"]
    eos_ids = tuple(dict.fromkeys(i for i in eos if i is not None))
    return SpecialTokens(bos_token_id=bos, eos_token_ids=eos_ids)


def hf_chat_template(folder: str, config: dict[str, Any]) -> ChatTemplate | None:
    """`chat_template.jinja` if present, else the config's template (the one named "default"
    when the config lists several)."""
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return ChatTemplate(f.read())
    source = config.get("chat_template")
    if isinstance(source, list):
        named = {entry.get("name"): entry.get("template") for entry in source if isinstance(entry, dict)}
        source = named.get("default")
    return ChatTemplate(source) if isinstance(source, str) and source else None


class HFTokenizer(FastTokenizer):
    """The tokenizer of a Hugging Face model folder."""

    def __init__(self, folder: str) -> None:
        tokenizer_json = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(tokenizer_json):
            raise UnsupportedTokenizerError(
                f"{folder}: no tokenizer.json (only fast-tokenizer folders are supported)"
            )
        backend = Backend.from_file(tokenizer_json)
        config = _read_json(os.path.join(folder, "tokenizer_config.json"))
        generation = _read_json(os.path.join(folder, "generation_config.json"))
        specials = hf_special_tokens(backend, config, generation)
        super().__init__(backend, specials, hf_chat_template(folder, config))
