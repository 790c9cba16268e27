"""A test-only driver for the model: blocks handed out in order, ForwardBatch built by hand.

It stands in for the engine (scheduler, block manager, sampler) so model and attention tests can
run prefill chunks and decode steps, alone or mixed in one pass, and greedy-decode.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.torch_backend import TorchAttentionBackend
from pdserve.kv.kv_cache import KVCache


@dataclass
class Sequence:
    tokens: list[int]
    computed: int = 0  # tokens whose K/V are in the pool
    blocks: list[int] = field(default_factory=list)


class PagedDriver:
    def __init__(
        self,
        model,
        block_size: int = 16,
        num_blocks: int = 256,
        backend: AttentionBackend | None = None,
        shuffle_seed: int | None = None,
    ):
        """shuffle_seed: hand blocks out in a seeded random order instead of 0, 1, 2, ..."""
        self.model = model
        config = model.config
        self.device = model.device
        self.kv = KVCache(config.kv_shape(block_size), num_blocks, model.dtype, self.device)
        self.backend = backend or TorchAttentionBackend()
        self._free = list(range(num_blocks))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(self._free)

    def new_sequence(self, prompt: list[int]) -> Sequence:
        return Sequence(list(prompt))

    def build_batch(self, work: list[tuple[Sequence, int]]) -> ForwardBatch:
        """Each (sequence, n): its next n uncomputed tokens; logits for each one's last token."""
        ids, positions, slots, spans, last = [], [], [], [], []
        for seq, n in work:
            start, end = seq.computed, seq.computed + n
            self._grow(seq, end)
            spans.append(SeqSpan(len(ids), n, end, tuple(seq.blocks)))
            ids += seq.tokens[start:end]
            positions += range(start, end)
            slots += [self._slot(seq, p) for p in range(start, end)]
            last.append(len(ids) - 1)
        return ForwardBatch(
            input_ids=self._long(ids),
            positions=self._long(positions),
            slot_mapping=self._long(slots),
            seqs=tuple(spans),
            logits_indices=self._long(last),
        )

    def step(self, work: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Runs one pass; returns logits [len(work), vocab] and marks the tokens computed."""
        logits = self.model(self.build_batch(work), self.kv, self.backend)
        for seq, n in work:
            seq.computed += n
        return logits

    def greedy(self, prompt: list[int], max_new_tokens: int, chunk: int | None = None) -> list[int]:
        seq = self.new_sequence(prompt)
        chunk = chunk or len(prompt)
        while seq.computed < len(prompt):
            logits = self.step([(seq, min(chunk, len(prompt) - seq.computed))])
        generated = []
        for _ in range(max_new_tokens):
            token = int(logits[0].argmax())
            generated.append(token)
            seq.tokens.append(token)
            if len(generated) < max_new_tokens:
                logits = self.step([(seq, 1)])
        return generated

    def _grow(self, seq: Sequence, length: int) -> None:
        while len(seq.blocks) * self.kv.block_size < length:
            seq.blocks.append(self._free.pop(0))

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.blocks[position // self.kv.block_size] * self.kv.block_size + position % self.kv.block_size

    def _long(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
