"""A withdrawal's `settled` future: resolves only once every stuck receive has completed."""

import asyncio
from dataclasses import dataclass

from pdserve.transfer import settled_all
from pdserve.transfer.ucx_worker import Settling


@dataclass
class FakeRequest:
    completed: bool = False


def test_settling_waits_for_every_stuck_request():
    async def main():
        requests = [FakeRequest(), FakeRequest()]
        settling = Settling(requests, [], asyncio.get_running_loop().create_future())
        polls = [settling.poll()]
        requests[0].completed = True
        polls.append(settling.poll())
        requests[1].completed = True
        polls.append(settling.poll())
        return polls, settling.future.done()

    assert asyncio.run(main()) == ([False, False, True], True)


def test_settled_all_needs_every_part_observable():
    async def main():
        loop = asyncio.get_running_loop()
        a, b = loop.create_future(), loop.create_future()
        both = settled_all([a, b])
        a.set_result(None)
        await asyncio.sleep(0)
        early = both.done()
        b.set_exception(RuntimeError("cancelled receive"))
        await both
        return early, settled_all([a, None]), settled_all([])

    assert asyncio.run(main()) == (False, None, None)
