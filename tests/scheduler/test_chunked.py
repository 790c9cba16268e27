"""The chunked policy: decodes first, prefill chunks fill the budget, per-request cap, classes,
the watermark."""

from __future__ import annotations

from pdserve.requests import Priority, RequestState
from tests.scheduler.fakes import build, request, run_until_idle, step


def chunks_of(output) -> dict[str, int]:
    return {c.request.request_id: c.num_tokens for c in output.chunks}


def test_decodes_first_then_prefill_chunks_fill_the_budget() -> None:
    s, ex, _ = build(token_budget=32, max_chunk_tokens=32, max_running=32)
    for i in range(4):
        s.add(request(f"d{i}", 4, max_tokens=50))
    step(s, ex)
    s.add(request("long", 200))
    out, _ = step(s, ex)
    assert [c.request.request_id for c in out.chunks[:4]] == ["d0", "d1", "d2", "d3"]
    assert all((c.start, c.num_tokens) == (4, 1) for c in out.chunks[:4])  # one decode token each
    assert chunks_of(out)["long"] == 28 and out.num_tokens == 32


def test_one_long_prompt_cannot_take_the_whole_budget() -> None:
    s, ex, _ = build(token_budget=64, max_chunk_tokens=16, num_blocks=256)
    s.add(request("long", 1000))
    s.add(request("short", 12))
    out, _ = step(s, ex)
    assert chunks_of(out) == {"long": 16, "short": 12}


def test_budget_is_shared_by_several_long_prompts() -> None:
    s, ex, _ = build(token_budget=64, max_chunk_tokens=16, num_blocks=512)
    for i in range(5):
        s.add(request(f"p{i}", 300))
    out, _ = step(s, ex)
    assert list(chunks_of(out).values()) == [16, 16, 16, 16] and out.num_tokens == 64


def test_higher_class_chunks_first_then_arrival() -> None:
    s, ex, _ = build(token_budget=32, max_chunk_tokens=16, num_blocks=256)
    s.add(request("batch", 100, priority=Priority.BATCH))
    s.add(request("normal", 100))
    s.add(request("vip", 100, priority=Priority.VIP))
    out, _ = step(s, ex)
    assert list(chunks_of(out)) == ["vip", "normal"]


def test_running_prefill_continues_from_where_it_stopped() -> None:
    s, ex, _ = build(token_budget=16, max_chunk_tokens=16)
    r = request("a", 40)
    s.add(r)
    starts = [step(s, ex)[0].chunks[0].start for _ in range(3)]
    assert starts == [0, 16, 32] and len(r.output_token_ids) == 1


def test_watermark_keeps_blocks_free_for_running_decodes() -> None:
    s, ex, _ = build(num_blocks=20, watermark=0.25, token_budget=64, max_chunk_tokens=64)
    s.add(request("a", 32, max_tokens=40))  # 8 blocks; nothing runs, so no watermark yet
    step(s, ex)
    s.add(request("b", 28))  # 7 more blocks would leave 4 free, under the 5-block watermark
    out, _ = step(s, ex)
    assert "b" not in chunks_of(out)
    assert s.get("b").state == RequestState.WAITING
    s.add(request("c", 24))  # ...and the queue head blocks later arrivals too
    assert "c" not in chunks_of(step(s, ex)[0])


def test_max_running_bounds_admission() -> None:
    s, ex, _ = build(max_running=2)
    for i in range(4):
        s.add(request(f"r{i}", 4, max_tokens=3))
    out, _ = step(s, ex)
    assert sorted(chunks_of(out)) == ["r0", "r1"] and s.stats().waiting == 2
    run_until_idle(s, ex)
