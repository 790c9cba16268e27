"""The query backend (deterministic mode's attention), on each of its CPU kernels: right against
dense float64 attention, and each position's output bitwise the same whether its row is a decode,
a row of a prefill chunk of any size, alone in its pass or beside other sequences; with windows
and another scale, and through the layer groups of a hybrid model's pool."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from pdserve.attention.base import LayerAttention
from pdserve.attention.batch import ForwardBatch, SeqSpan
from pdserve.attention.query_backend import QueryAttentionBackend, query_rows
from pdserve.attention.query_kernels import NativeQueries, TorchQueries
from pdserve.kv.kv_cache import KVCache
from pdserve.kv.kv_shape import KVShape
from pdserve.kv.page_groups import PageGroups
from tests.helpers.kernels import decode_kernel

pytestmark = pytest.mark.timeout(300)

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 2, 4, 2, 16, 4
LENGTHS = (1, 5, 9, 23, 40)  # tokens of each sequence
KINDS = (LayerAttention(), LayerAttention(window=6, scale=0.3))  # layer 0 full, layer 1 windowed


@pytest.fixture(scope="module", params=["native", "torch"])
def make_backend(request):
    if request.param == "native":
        native = decode_kernel()
        return lambda: QueryAttentionBackend(NativeQueries(native))
    return lambda: QueryAttentionBackend(TorchQueries())


@dataclass(frozen=True)
class Sequences:
    """Each sequence's queries, keys and values at every position and layer, and its blocks."""

    q: list[torch.Tensor]  # per sequence [LAYERS, n, H, D]
    k: list[torch.Tensor]  # per sequence [LAYERS, n, Hkv, D]
    v: list[torch.Tensor]
    tables: list[tuple[int, ...]]


def sequences(groups: int = 1) -> Sequences:
    gen = torch.Generator().manual_seed(0)
    blocks = iter(torch.randperm(sum(-(-n // BLOCK) for n in LENGTHS) * groups, generator=gen).tolist())

    def rand(heads: int) -> list[torch.Tensor]:
        return [torch.randn(LAYERS, n, heads, HEAD_DIM, generator=gen) for n in LENGTHS]

    return Sequences(rand(HEADS), rand(KV_HEADS), rand(KV_HEADS),
                     [tuple(next(blocks) for _ in range(-(-n // BLOCK) * groups)) for n in LENGTHS])


def fresh_pool(groups: PageGroups | None = None) -> KVCache:
    count = sum(-(-n // BLOCK) for n in LENGTHS) * (groups.count if groups else 1)
    return KVCache(KVShape(LAYERS, KV_HEADS, HEAD_DIM, BLOCK), count, torch.float32, "cpu", groups=groups)


def run_pass(backend, kv: KVCache, seqs: Sequences, chunks: list[tuple[int, int, int]], groups: int = 1):
    """One pass of chunks (sequence, first position, tokens); returns {(sequence, position): [LAYERS, H, D]}."""
    spans, slots, rows, start = [], [[] for _ in range(groups)], [], 0
    for index, first, count in chunks:
        table = seqs.tables[index]
        spans.append(SeqSpan(start, count, first + count, table))
        for g in range(groups):
            slots[g] += [table[(p // BLOCK) * groups + g] * BLOCK + p % BLOCK for p in range(first, first + count)]
        rows += [(index, p) for p in range(first, first + count)]
        start += count
    group_slots = tuple(torch.tensor(s) for s in slots) if groups > 1 else ()
    batch = ForwardBatch(torch.zeros(start, dtype=torch.long), torch.zeros(start, dtype=torch.long),
                         torch.tensor(slots[0]), tuple(spans), torch.zeros(0, dtype=torch.long), group_slots)
    backend.begin(batch, kv, KINDS)
    outs = []
    for layer in range(LAYERS):
        q, k, v = (torch.stack([t[i][layer, p] for i, p in rows]) for t in (seqs.q, seqs.k, seqs.v))
        outs.append(backend.forward(layer, q, k, v, kv))
    return {row: torch.stack([out[r] for out in outs]) for r, row in enumerate(rows)}


def expected(seqs: Sequences, index: int, position: int, layer: int) -> torch.Tensor:
    """Dense float64 attention of one query: [H, D]."""
    kind, group = KINDS[layer], HEADS // KV_HEADS
    first = 0 if kind.window is None else max(0, position + 1 - kind.window)
    scale = 1 / math.sqrt(HEAD_DIM) if kind.scale is None else kind.scale
    keys = seqs.k[index][layer, first:position + 1].double()
    values = seqs.v[index][layer, first:position + 1].double()
    q = seqs.q[index][layer, position].double()
    heads = [torch.softmax(keys[:, h // group] @ q[h] * scale, 0) @ values[:, h // group] for h in range(HEADS)]
    return torch.stack(heads)


def whole_prompts() -> list[list[tuple[int, int, int]]]:
    return [[(i, 0, n) for i, n in enumerate(LENGTHS)]]


def chunked(size: int) -> list[list[tuple[int, int, int]]]:
    """Every sequence in chunks of `size` (its last ones decodes), all sequences side by side."""
    passes, step = [], 0
    while any(step * size < n for n in LENGTHS):
        passes.append([(i, step * size, min(size, n - step * size)) for i, n in enumerate(LENGTHS) if step * size < n])
        step += 1
    return passes


def alone_decoding() -> list[list[tuple[int, int, int]]]:
    """Each sequence alone, a position a pass."""
    return [[(i, p, 1)] for i, n in enumerate(LENGTHS) for p in range(n)]


def outputs(make_backend, schedule, groups: PageGroups | None = None) -> dict:
    kv, backend, seqs = fresh_pool(groups), make_backend(), sequences(groups.count if groups else 1)
    found = {}
    for chunks in schedule:
        found.update(run_pass(backend, kv, seqs, chunks, groups.count if groups else 1))
    return found


def test_every_row_attends_as_dense_attention_does(make_backend):
    seqs = sequences()
    found = outputs(make_backend, whole_prompts())
    for (index, position), out in found.items():
        for layer in range(LAYERS):
            want = expected(seqs, index, position, layer)
            torch.testing.assert_close(out[layer].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", [chunked(1), chunked(3), chunked(16), alone_decoding()],
                         ids=["decodes", "chunks-of-3", "chunks-of-16", "alone"])
def test_a_position_gets_the_same_bits_however_it_is_batched(make_backend, schedule):
    reference = outputs(make_backend, whole_prompts())
    found = outputs(make_backend, schedule)
    assert found.keys() == reference.keys()
    assert [key for key in found if not torch.equal(found[key], reference[key])] == []


def test_layer_groups_of_a_hybrid_pool(make_backend):
    """Layer 0 full and layer 1 windowed, each in its own group of pages (Gemma 3's layout)."""
    groups = PageGroups.of([None, KINDS[1].window])
    reference = outputs(make_backend, whole_prompts(), groups)
    found = outputs(make_backend, chunked(3), groups)
    assert [key for key in found if not torch.equal(found[key], reference[key])] == []
    seqs = sequences(groups.count)
    for (index, position), out in found.items():
        torch.testing.assert_close(out[1].double(), expected(seqs, index, position, 1), rtol=1e-5, atol=1e-5)


def test_rows_are_listed_in_batch_order():
    batch = ForwardBatch(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long),
                         torch.zeros(4, dtype=torch.long), (SeqSpan(3, 1, 9, (0, 1, 2)), SeqSpan(0, 3, 5, (3, 4))),
                         torch.zeros(0, dtype=torch.long))
    assert [(s.query_start, s.context_len) for s in query_rows(batch)] == [(0, 3), (1, 4), (2, 5), (3, 9)]


def test_flashinfers_rows_each_a_decode_over_its_own_pages_with_the_split_off(monkeypatch):
    """No kernel runs (a recording stand-in for flashinfer): each row's pages and the plan's options."""
    import sys

    from pdserve.attention.flashinfer_queries import DETERMINISTIC_OPTION, FlashInferQueries, row_pages
    from tests.attention.recording_flashinfer import RecordingFlashInfer

    rows = [SeqSpan(0, 1, 3, (7, 8)), SeqSpan(1, 1, 4, (7, 8)), SeqSpan(2, 1, 5, (7, 8, 9))]
    pages = row_pages(rows, 4, "cpu")
    assert (pages.indptr.tolist(), pages.indices.tolist(), pages.last_page_len.tolist()) == \
        ([0, 1, 2, 4], [7, 7, 7, 8], [3, 4, 1])
    recording = RecordingFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", recording)
    kv, backend = fresh_pool(), QueryAttentionBackend(FlashInferQueries("cpu"))
    seqs = sequences()
    run_pass(backend, kv, seqs, [(0, 0, 1), (3, 0, 5)])
    plans = [c for c in recording.calls if c.target.endswith(".plan")]
    assert len(plans) == 2 and all(c.kwargs[DETERMINISTIC_OPTION] is True for c in plans)  # a plan per kind
    windowed = next(c for c in plans if "window_left" in c.kwargs)
    assert (windowed.kwargs["window_left"], windowed.kwargs["sm_scale"]) == (KINDS[1].window - 1, KINDS[1].scale)
    assert plans[0].args[0].tolist() == [0, 1, 2, 3, 4, 5, 7]  # rows of 1, 1..5 positions: 1 + 1 + 1 + 1 + 2 pages
