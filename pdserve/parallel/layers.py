"""Megatron-style parallel layers: each holds one rank's slice of a full layer's weights and
calls the communicator where the math needs the other ranks.

    ColumnParallelLinear   y[:, cols] = x @ W[:, cols] (+ b[cols])        output stays split
    RowParallelLinear      y = all_reduce(x[:, rows] @ W[rows, :]) (+ b)  input arrives split
    VocabParallelEmbedding rows [start, end) of the table; other ids look up zeros, then all_reduce
    VocabParallelLMHead    logits of the rank's vocabulary slice, all_gather -> [S, vocab]

Weights keep the model's [in, out] layout (pdserve/model/layers.py Linear).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pdserve.model.layers import Linear
from pdserve.parallel.communicator import Communicator


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    def __init__(self, full: Linear, columns: torch.Tensor):
        """columns: [n] int64, the output features of `full` this rank computes, in order."""
        super().__init__()
        columns = columns.to(full.weight.device)
        self.weight = _frozen(full.weight.detach().index_select(1, columns))  # [in, n]
        self.bias = None if full.bias is None else _frozen(full.bias.detach().index_select(0, columns))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, in] -> [T, n]."""
        if self.bias is None:
            return x @ self.weight
        return torch.addmm(self.bias, x, self.weight)


class RowParallelLinear(nn.Module):
    def __init__(self, full: Linear, rows: torch.Tensor, comm: Communicator):
        """rows: [n] int64, the input features of `full` that reach this rank, in order."""
        super().__init__()
        self.comm = comm
        self.weight = _frozen(full.weight.detach().index_select(0, rows.to(full.weight.device)))  # [n, out]
        self.bias = None if full.bias is None else _frozen(full.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, n] -> [T, out], summed over the ranks; the bias added once, after the sum."""
        y = self.comm.all_reduce(x @ self.weight)
        return y if self.bias is None else y + self.bias


class VocabSlice:
    """Rank r's ids [start, end) of a vocabulary cut into world_size equal parts of `size`
    (the last padded where the vocabulary does not divide)."""

    def __init__(self, vocab_size: int, rank: int, world_size: int):
        self.vocab_size = vocab_size
        self.size = -(-vocab_size // world_size)
        self.start = min(rank * self.size, vocab_size)
        self.end = min(self.start + self.size, vocab_size)

    def rows(self, table: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of `table` along `dim`, zero-padded to `size`."""
        part = table.narrow(dim, self.start, self.end - self.start)
        missing = self.size - part.shape[dim]
        if missing == 0:
            return part
        pad = [0, 0] * (table.dim() - 1 - dim) + [0, missing]
        return F.pad(part, pad)


class VocabParallelLMHead(nn.Module):
    def __init__(self, full: Linear, vocab: VocabSlice, comm: Communicator):
        super().__init__()
        self.vocab, self.comm = vocab, comm
        self.weight = _frozen(vocab.rows(full.weight.detach(), dim=1))  # [hidden, vocab.size]

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: [S, hidden] -> logits [S, vocab_size], on every rank (copied into `out` where given)."""
        logits = self.comm.all_gather(x @ self.weight)[:, : self.vocab.vocab_size]
        return logits if out is None else out.copy_(logits)


class VocabParallelEmbedding(nn.Module):
    """The embedding table's rows [start, end) ([size, hidden]); or, for tied embeddings, the
    columns of the rank's LM head ([hidden, size]), shared with it."""

    def __init__(self, vocab: VocabSlice, comm: Communicator, table: nn.Embedding | None = None,
                 tied: VocabParallelLMHead | None = None):
        super().__init__()
        self.vocab, self.comm, self.tied = vocab, comm, tied
        self.weight = None if table is None else _frozen(vocab.rows(table.weight.detach(), dim=0))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden]: each id's row from the rank that holds it, zeros from the others, summed."""
        inside = (input_ids >= self.vocab.start) & (input_ids < self.vocab.end)
        local = torch.where(inside, input_ids - self.vocab.start, torch.zeros_like(input_ids))
        rows = self._lookup(local) * inside.unsqueeze(-1).to(self._dtype())  # [T, hidden]
        return self.comm.all_reduce(rows.contiguous())

    def _lookup(self, local: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return F.embedding(local, self.weight)
        assert self.tied is not None
        return self.tied.weight.index_select(1, local).t()

    def _dtype(self) -> torch.dtype:
        return (self.weight if self.weight is not None else self.tied.weight).dtype
