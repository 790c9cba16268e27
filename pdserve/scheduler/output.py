"""What the scheduler hands the executor each step. Typed, tensor-free.

The executor (engine model runner, or the simulator's cost model) must, in this order:
  1. copy `swap_out` block pairs device -> host, then `swap_in` pairs host -> device;
  2. run one forward pass over `chunks` (decodes are chunks of one token);
  3. sample one token for each chunk with `samples=True`;
  4. call `Scheduler.update(output, sampled)` with those tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pdserve.requests import PreemptionMode, Request


@dataclass(slots=True, eq=False)
class ScheduledChunk:
    """Compute `request.all_token_ids[start:start + num_tokens]` this step. Built by `make_chunk()`.
    NOTE: never changed once made (not frozen: one is built for every decode of every step,
    and a frozen dataclass costs several times as much to build)."""

    request: Request
    start: int
    num_tokens: int
    block_table: tuple[int, ...]  # device blocks covering [0, start + num_tokens)
    # True when the chunk reaches the last known token: a new token is sampled. Fixed when the
    # chunk is made (the request grows afterwards).
    samples: bool

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1 and self.start == self.request.num_tokens - 1 and bool(
            self.request.output_token_ids
        )


def decode_chunks(requests: Iterable[Request], tables: Iterable[tuple[int, ...]]) -> list[ScheduledChunk]:
    """One-token chunks at each request's first uncomputed token, which is its last (so each
    samples), with its block table.
    NOTE: built for every decode of every step: each chunk's slots are set directly, skipping
    the generated __init__ (a third of the cost of building one)."""
    chunks, new = [], object.__new__
    for request, table in zip(requests, tables):
        chunk = new(ScheduledChunk)
        chunk.request, chunk.start, chunk.num_tokens = request, request.num_computed_tokens, 1
        chunk.block_table, chunk.samples = table, True
        chunks.append(chunk)
    return chunks


def make_chunk(request: Request, start: int, num_tokens: int, block_table: tuple[int, ...]) -> ScheduledChunk:
    """The chunk of `num_tokens` from `start`; `samples` from the request's length now."""
    return ScheduledChunk(request, start, num_tokens, block_table, start + num_tokens == request.num_tokens)


@dataclass(frozen=True)
class Preemption:
    request: Request
    mode: PreemptionMode
    reason: str  # "out_of_blocks" | "higher_priority_waiting" | "time_slice"


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    swap_out: tuple[tuple[int, int], ...] = ()  # (device block, host block)
    swap_in: tuple[tuple[int, int], ...] = ()  # (host block, device block)
    resumed: tuple[Request, ...] = ()  # swapped-in or re-admitted after preemption
    finished: tuple[Request, ...] = field(default=())  # aborted/finished before this step ran

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.swap_out and not self.swap_in
