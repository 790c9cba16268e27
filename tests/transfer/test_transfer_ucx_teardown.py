"""Closing UCX ends destroys their native objects there and then, never in a later collection.

A garbage collection that destroys a UCX worker, endpoint or request runs their destructors (which
release the GIL and progress the worker) at whatever allocation triggered it; closing must leave
nothing of the kind behind, even when the ends themselves sit in a reference cycle, as they do
whenever a caught exception's traceback holds them.
"""

import asyncio
import gc

import pytest

from pdserve.transfer import TransferError, TransferRejected, TransferTimeout
from pdserve.transfer.ucx import UcxConfig, UcxTransport
from tests.transfer.transfer_helpers import SECRET, make_pool, posted, run

pytestmark = pytest.mark.timeout(60)


# the binding's types that own a native handle (tags and masks are plain values)
NATIVE = {"UCXContext", "UCXWorker", "UCXEndpoint", "UCXRequest", "UCXBufferRequest", "UCXAddress"}


def ucx_objects_in(objects, depth=4):
    """UCX objects with a native handle reachable from `objects` within `depth` references."""
    found, seen, frontier = [], set(), list(objects)
    for _ in range(depth):
        next_frontier = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if type(obj).__module__.startswith("ucxx") and type(obj).__name__ in NATIVE:
                found.append(type(obj).__name__)
            next_frontier.extend(gc.get_referents(obj))
        frontier = next_frontier
    return found


def cyclic_garbage():
    """What the next collection would free, kept for inspection instead."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def exercise(sender, receiver, caught):
    """A piece delivered, a refused secret, a send nobody expects, a receive never sent."""
    expect = asyncio.create_task(receiver.expect("ok", 0, [(0, 0), (1, 1)], 10.0, secret=SECRET))
    await posted(receiver, "ok", (0,), expect)
    await sender.send(receiver.address(), "ok", 0, [(0, 0), (1, 1)], 10.0, secret=SECRET)
    await expect
    for attempt in (receiver.expect("bad", 0, [(2, 2)], 1.0, secret=b"short"),
                    sender.send(receiver.address(), "lost", 0, [(3, 3)], 0.3, secret=SECRET)):
        try:
            await attempt
        except (TransferRejected, TransferTimeout, ValueError) as exc:
            caught.append(exc)  # the frame holds the exception, whose traceback holds the frame
    waiting = asyncio.create_task(receiver.expect("never", 0, [(4, 4)], 30.0, secret=SECRET))
    await posted(receiver, "never", (0,), waiting)
    return waiting


def test_closed_ends_leave_no_ucx_object_to_the_garbage_collector():
    async def main():
        transport = UcxTransport(UcxConfig(max_message_bytes=65536))
        sender, receiver = transport.sender(make_pool(fill=True)), transport.receiver(make_pool(fill=False))
        caught = []
        waiting = await exercise(sender, receiver, caught)
        cycle = {"sender": sender, "receiver": receiver, "caught": caught}
        cycle["self"] = cycle
        await sender.close()
        await receiver.close()
        with pytest.raises(TransferError):
            await waiting
        return len(caught)

    gc.collect()
    assert run(main()) == 2
    assert ucx_objects_in(cyclic_garbage()) == []


def test_closing_twice_and_using_a_closed_receiver_are_harmless():
    async def main():
        transport = UcxTransport(UcxConfig())
        sender, receiver = transport.sender(make_pool(fill=True)), transport.receiver(make_pool(fill=False))
        await receiver.close()
        await receiver.close()
        with pytest.raises(TransferRejected):
            await receiver.expect("late", 0, [(0, 0)], 1.0, secret=SECRET)
        cancelled = receiver.cancel("late")
        await sender.close()
        await sender.close()
        with pytest.raises(TransferError):
            await sender.send(receiver.address(), "late", 0, [(0, 0)], 1.0, secret=SECRET)
        return cancelled.pieces

    assert run(main()) == 0
