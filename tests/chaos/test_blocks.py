"""Waiting for every worker's active blocks to reach zero: who counts, who is excused, when it gives up."""

from __future__ import annotations

import time

from pdserve.chaos.blocks import WorkerBlocks, all_zero, wait_zero


def answers(**active) -> tuple[WorkerBlocks, ...]:
    return tuple(WorkerBlocks(name.replace("_", "-"), value) for name, value in active.items())


def test_zero_means_every_worker_answered_zero_or_is_gone_through_a_restart():
    assert all_zero(answers(decode_0=0, prefill_0=0))
    assert not all_zero(answers(decode_0=3, prefill_0=0))
    assert not all_zero(answers(decode_0=None, prefill_0=0))  # a stopped worker may hold its blocks
    assert all_zero(answers(decode_0=None, prefill_0=0), {"decode-0"})
    assert not all_zero(answers(decode_0=2, prefill_0=0), {"decode-0"})  # a draining one answers for itself


def test_the_time_counts_from_the_loads_end_until_the_poll_that_saw_all_zero():
    polls, zero_seen = iter([answers(d=4), answers(d=1), answers(d=0)]), []

    def poll() -> tuple[WorkerBlocks, ...]:
        answer = next(polls)
        if all_zero(answer):
            zero_seen.append(time.time())
        return answer

    since = time.time()
    drain = wait_zero(poll, since, limit_s=10.0, every_s=0.05)
    returned = time.time()
    assert drain.zero_after_s is not None and drain.zero_after_s >= 0.1  # two pauses before the third poll
    assert zero_seen[0] - since <= drain.zero_after_s <= returned - since  # that poll's time, however slow
    assert drain.describe().endswith(" s")


def test_blocks_still_held_at_the_limit_are_reported_by_worker():
    drain = wait_zero(lambda: answers(decode_0=7, prefill_0=0, decode_1=None), time.time(), limit_s=0.2,
                      every_s=0.05)
    assert drain.zero_after_s is None
    assert drain.describe() == "not zero after 0 s (decode-0=7, decode-1=?)"


def test_a_worker_excused_while_restarting_does_not_hold_up_the_others():
    restarting, polled = {"decode-1"}, []

    def poll() -> tuple[WorkerBlocks, ...]:
        polled.append(time.time())
        return answers(decode_0=0, decode_1=None)

    since = time.time()
    drain = wait_zero(poll, since, 5.0, lambda: restarting)
    assert len(polled) == 1  # its first poll ended the wait
    assert drain.zero_after_s is not None and polled[0] - since <= drain.zero_after_s <= time.time() - since
