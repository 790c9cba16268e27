"""The policy objects on their own: queue order, aging, victims, recompute-or-swap, chunking."""

from __future__ import annotations

from pdserve.config import PreemptionConfig
from pdserve.requests import PreemptionMode, Priority, Request
from pdserve.scheduler.chunking import CappedChunks, WholePrompt
from pdserve.scheduler.ordering import ArrivalOrder, PriorityOrder
from pdserve.scheduler.plan import StepPlan
from pdserve.scheduler.preemption_mode import AlwaysRecompute, CostBasedMode
from pdserve.scheduler.queue import Group, RequestQueue
from pdserve.scheduler.stopping import stop_reason
from pdserve.scheduler.victims import Claim, LowestClassLatest


def req(rid: str, priority: Priority = Priority.NORMAL, seq: int = 0, admit: int = 0) -> Request:
    r = Request(rid, [1, 2, 3], priority=priority)
    r.arrival_seq, r.admit_seq = seq, admit
    return r


def test_aging_lifts_one_class_per_period_up_to_normal() -> None:
    order = PriorityOrder(aging_seconds=10.0)
    batch, normal = req("b", Priority.BATCH), req("n")
    assert [order.rank(batch, t) for t in (0, 9.9, 10, 25, 1000)] == [2, 2, 1, 1, 1]
    assert order.rank(normal, 1000) == 1 and order.rank(req("v", Priority.VIP), 0) == 0  # VIP rank is VIPs' alone
    assert PriorityOrder(None).rank(batch, 1e9) == 2
    assert ArrivalOrder().rank(batch, 0) == 0 == ArrivalOrder().lane(req("v", Priority.VIP))


def test_queue_orders_by_rank_then_arrival_across_lanes() -> None:
    q = RequestQueue(PriorityOrder(aging_seconds=10.0), Group.WAITING)
    old_batch, vip, normal, new_batch = (req("old_batch", Priority.BATCH, 0), req("vip", Priority.VIP, 1),
                                         req("normal", Priority.NORMAL, 2), req("new_batch", Priority.BATCH, 3))
    q.push(old_batch, entered=0.0)
    q.push(vip, entered=5.0)
    q.push(normal, entered=6.0)
    q.push(new_batch, entered=7.0)
    now = 12.0  # old_batch waited 12 s: one class up, level with normal but earlier
    assert [c.request.request_id for c in q.candidates(now)] == ["vip", "old_batch", "normal", "new_batch"]
    assert [c.request.request_id for c in q.candidates(1000.0)] == ["vip", "old_batch", "normal", "new_batch"]
    q.remove(vip)
    assert len(q) == 3 and [c.rank for c in q.candidates(now)] == [1, 1, 2]


def test_a_request_entered_earlier_goes_ahead_in_its_lane_whatever_its_arrival() -> None:
    # a hand-over arrives last (highest seq) but entered as old as its age says
    q = RequestQueue(PriorityOrder(aging_seconds=10.0), Group.WAITING)
    first, second = req("first", Priority.BATCH, seq=0), req("second", Priority.BATCH, seq=1)
    handed_over = req("handed_over", Priority.BATCH, seq=2)
    q.push(first, entered=5.0)
    q.push(second, entered=6.0)
    q.push(handed_over, entered=-8.0)
    now = 7.0  # handed_over waited 15 s: one class up
    assert [(c.request.request_id, c.rank) for c in q.candidates(now)] == [("handed_over", 1), ("first", 2),
                                                                           ("second", 2)]
    q.remove(handed_over)
    assert [c.request.request_id for c in q.candidates(now)] == ["first", "second"]


def test_queue_snapshot_allows_removal_while_iterating() -> None:
    q = RequestQueue(ArrivalOrder(), Group.WAITING)
    requests = [req(f"r{i}", seq=i) for i in range(5)]
    for r in requests:
        q.push(r, 0.0)
    seen = []
    for cand in q.candidates(0.0):
        seen.append(cand.request.request_id)
        q.remove(cand.request)
    assert seen == [r.request_id for r in requests] and len(q) == 0


def test_victim_is_lowest_class_then_latest_admitted_never_vip_or_protected() -> None:
    running = [req("vip", Priority.VIP, admit=9), req("n_old", admit=1), req("b_old", Priority.BATCH, admit=2),
               req("b_new", Priority.BATCH, admit=3), req("n_new", admit=4)]
    pick = LowestClassLatest().pick
    rank = lambda r: int(r.priority)  # noqa: E731
    assert pick(running, set(), rank).request_id == "b_new"
    assert pick(running, {"b_new"}, rank).request_id == "b_old"
    assert pick(running, {"b_new", "b_old"}, rank).request_id == "n_new"
    assert pick(running, set(), rank, Claim(2, Priority.BATCH)) is None  # nobody ranks worse than 2
    assert pick(running, set(), rank, Claim(1, Priority.NORMAL)).request_id == "b_new"
    assert pick(running, {"b_new", "b_old"}, rank, Claim(1, Priority.NORMAL)) is None  # never its own class
    assert pick(running, {"b_new", "b_old"}, rank, Claim(0, Priority.VIP)).request_id == "n_new"
    assert pick(running[:1], set(), rank) is None


def test_a_claim_reaches_lower_classes_admitted_at_a_worse_rank() -> None:
    vip, normal, aged_batch = Claim(0, Priority.VIP), Claim(1, Priority.NORMAL), Claim(1, Priority.BATCH)
    assert vip.over(1, Priority.NORMAL) and vip.over(1, Priority.BATCH) and not vip.over(2, Priority.VIP)
    assert normal.over(2, Priority.BATCH) and not normal.over(1, Priority.BATCH)  # a BATCH admitted lifted
    assert not normal.over(1, Priority.NORMAL) and not aged_batch.over(2, Priority.BATCH)  # never its own class
    assert vip.covers(normal) and normal.covers(aged_batch) and not aged_batch.covers(normal)
    assert not normal.covers(vip)


def test_recompute_or_swap_by_thresholds_cost_and_host_room() -> None:
    cfg = PreemptionConfig(recompute_below_tokens=2048, swap_above_tokens=16384,
                           prefill_tokens_per_s=5000.0, host_link_bytes_per_s=8e9)
    cheap_link = CostBasedMode(cfg, kv_bytes_per_token=40_000, block_size=16)
    assert cheap_link.choose(1000, host_free_blocks=10**6) == PreemptionMode.RECOMPUTE
    assert cheap_link.choose(20000, host_free_blocks=10**6) == PreemptionMode.SWAP
    assert cheap_link.choose(20000, host_free_blocks=100) == PreemptionMode.RECOMPUTE  # no host room
    # between the thresholds: 4096 tokens recompute in 0.82 s; swap out+in of 4096 x 40 KB is 0.04 s
    assert cheap_link.choose(4096, 10**6) == PreemptionMode.SWAP
    huge_kv = CostBasedMode(cfg, kv_bytes_per_token=10_000_000, block_size=16)  # swap would take 10 s
    assert huge_kv.choose(4096, 10**6) == PreemptionMode.RECOMPUTE
    assert huge_kv.recompute_seconds(5000) == 1.0
    assert AlwaysRecompute().choose(10**6, 10**6) == PreemptionMode.RECOMPUTE


def plan(budget_left: int, step_tokens: int) -> StepPlan:
    step = StepPlan(budget_left + step_tokens, now=0.0)
    step.budget_left, step.num_tokens = budget_left, step_tokens
    return step


def test_chunk_policies() -> None:
    capped = CappedChunks(max_chunk_tokens=512)
    assert capped.size(65536, 0, plan(budget_left=2048, step_tokens=0)) == 512
    assert capped.size(100, 0, plan(budget_left=2048, step_tokens=0)) == 100
    assert capped.size(100, 0, plan(budget_left=0, step_tokens=2048)) == 0
    whole = WholePrompt()
    assert whole.size(5000, 0, plan(budget_left=2048, step_tokens=0)) == 5000  # alone, over budget
    assert whole.size(5000, 0, plan(budget_left=2000, step_tokens=48)) == 0
    assert whole.size(100, 0, plan(budget_left=2000, step_tokens=48)) == 100


def test_stop_reason_order() -> None:
    r = Request("r", [1, 2], eos_token_ids=(2,))
    assert stop_reason(r, 100) is None
    r.output_token_ids = [2]
    assert stop_reason(r, 100).value == "stop"
    r.output_token_ids = [5]
    assert stop_reason(r, 3).value == "length"
