"""The host buffer a worker's steps write their logits into, reused from step to step.

A step's logits are rows x vocabulary floats: 50 MB at 256 rows of the embedded model's 49K
vocabulary, 128 MB at 256 rows of a 128K one. A new tensor of that size each step is a new
mapping (glibc maps anything over 32 MB afresh and unmaps it on free), so every step faulted in
and zeroed every page again: one thread on the development machine, the embedded model's lm_head
product fell from 108 to 91 GFLOP/s past 170 rows for that alone (docs/BENCHMARKS.md, "The logits
buffer"). Telling glibc to keep such buffers instead held several times their size in the heap.

The model runner owns one HostLogits. A step's logits are a view of it, valid until the next
step: the runner samples them and computes their logprobs before it returns, and nothing keeps
them. On a CPU model of float32 the lm_head writes into the view; otherwise the model's own
logits are copied there (from a GPU into page-locked memory).
"""

from __future__ import annotations

import torch


class HostLogits:
    def __init__(self, vocab_size: int, pinned: bool = False):
        self.vocab_size, self.pinned = vocab_size, pinned
        self._buffer = torch.empty(0, vocab_size, dtype=torch.float32)

    def rows(self, count: int) -> torch.Tensor:
        """A float32 [count, vocab] view, its contents undefined; the buffer grows (to the larger
        of `count` and twice what it held) where it holds fewer rows."""
        if count > self._buffer.shape[0]:
            size = max(count, 2 * self._buffer.shape[0])
            self._buffer = torch.empty(size, self.vocab_size, dtype=torch.float32, pin_memory=self.pinned)
        return self._buffer[:count]

    @property
    def capacity(self) -> int:
        return self._buffer.shape[0]
