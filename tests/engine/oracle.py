"""transformers as the oracle for engine tests: models loaded on first use, greedy continuations
memoised, so every test of a session asks each (model, prompt) question once."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.hf_models import load_hf_model
from tests.helpers.reference import hf_greedy


class Oracle:
    def __init__(self, sources: dict[str, Path]):
        """sources: model name -> checkpoint folder or .gguf file."""
        self._sources = sources
        self._models: dict[str, torch.nn.Module] = {}
        self._answers: dict[tuple[str, tuple[int, ...], int], list[int]] = {}

    def greedy(self, name: str, prompt: list[int], max_new_tokens: int) -> list[int]:
        """transformers' greedy ids after `prompt`, eos ignored."""
        key = (name, tuple(prompt), max_new_tokens)
        if key not in self._answers:
            self._answers[key] = hf_greedy(self._model(name), list(prompt), max_new_tokens)
        return list(self._answers[key])

    def _model(self, name: str) -> torch.nn.Module:
        if name not in self._models:
            self._models[name] = load_hf_model(self._sources[name])
        return self._models[name]
