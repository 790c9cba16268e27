"""wait_until / wait_for / async_wait_until: return when the condition holds, fail clearly when it never does."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.helpers.waiting import WaitTimeout, async_wait_until, wait_for, wait_until


def test_returns_once_the_condition_holds():
    calls = itertools.count()
    wait_until(lambda: next(calls) >= 3, 10, "three polls", interval_s=0)
    assert wait_for(lambda: next(calls) if next(calls) > 6 else None, 10, "a value", interval_s=0) > 6


def test_names_what_it_waited_for_and_the_last_error():
    def refuses():
        raise ConnectionRefusedError("not yet")

    with pytest.raises(WaitTimeout, match=r"the server.*ConnectionRefusedError"):
        wait_until(refuses, 0.05, "the server", interval_s=0.01)
    with pytest.raises(WaitTimeout, match="never"):
        wait_until(lambda: False, 0, "never")


def test_async_polls_with_the_loop_running():
    async def scenario():
        flag = asyncio.Event()
        asyncio.get_running_loop().call_soon(flag.set)
        await async_wait_until(flag.is_set, 10, "the callback")

        async def later():
            return flag.is_set()

        await async_wait_until(later, 10, "an async predicate")
        with pytest.raises(WaitTimeout, match="nothing"):
            await async_wait_until(lambda: False, 0.02, "nothing")

    asyncio.run(scenario())
