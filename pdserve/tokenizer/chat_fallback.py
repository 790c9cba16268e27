"""The chat format of an architecture whose GGUF file carries no `tokenizer.chat_template`.

A model without a template gets none (chat requests are refused, base.py): a guessed format
degrades answers silently. The exception is an architecture with one documented format of its
own, which its files sometimes leave out (gemma-3-270m's GGUF does):

    architecture  format                                             its turns end with
    gemma3        Gemma's, as the template of Google's instruction-  <end_of_turn>, which also ends
                  tuned Gemma 3 checkpoints renders it:              a generation (gemma3_config.py)

        <bos><start_of_turn>user\\n{system}\\n\\n{user}<end_of_turn>\\n
        <start_of_turn>model\\n{assistant}<end_of_turn>\\n
        ...
        <start_of_turn>model\\n                                     (the generation prompt)

    A system message, first only, is folded into the first user turn; the other turns alternate
    user, assistant (as "model"), user, ... and each one's content is stripped of surrounding
    whitespace (the system text is not).

Loading a file that takes the fallback logs it once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pdserve.tokenizer.chat_template import ChatTemplate

log = logging.getLogger(__name__)

GEMMA_CHAT_TEMPLATE = r"""{{- bos_token -}}
{%- set system = messages[0]['content'] ~ '\n\n' if messages[0]['role'] == 'system' else '' -%}
{%- for message in (messages[1:] if system else messages) -%}
  {%- if (message['role'] == 'user') != (loop.index0 is even) -%}
    {{- raise_exception('Gemma turns alternate user and assistant from a user turn (a system message: first only)') -}}
  {%- endif -%}
  {{- '<start_of_turn>' ~ ('model' if message['role'] == 'assistant' else message['role']) ~ '\n' -}}
  {{- (system if loop.first else '') ~ (message['content'] | trim) ~ '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"""

FALLBACK_TEMPLATES: Mapping[str, str] = MappingProxyType({"gemma3": GEMMA_CHAT_TEMPLATE})


def gguf_chat_template(meta: dict[str, Any], path: str) -> ChatTemplate | None:
    """The file's template; where it has none, its architecture's format (logged); else None."""
    source = meta.get("tokenizer.chat_template")
    if source:
        return ChatTemplate(source)
    architecture = meta.get("general.architecture")
    fallback = FALLBACK_TEMPLATES.get(architecture)
    if fallback is None:
        return None
    log.info("%s carries no chat template: chat requests take %s's own format (pdserve/tokenizer/chat_fallback.py)",
             path, architecture)
    return ChatTemplate(fallback)
