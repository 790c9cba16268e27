"""A decode worker keeps a reattachable request whose router went away (its call broke without an
Abort) for its grace, decoding on, and another router attaches it and gets every token once
(decode_service/orphans.py). Routers are the real gRPC clients over a real decode worker on the
tiny model; a router "dies" when its channels close without closing its calls."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.aborts import Owner
from pdserve.reattach import HeldAttempt, prompt_digest
from pdserve.requests import Priority, SamplingParams
from pdserve.rpc.channels import ChannelPool
from pdserve.worker.events import Attached, Finished, Tokens
from pdserve.worker.leases import LeaseKind, Reclaim
from router.fleet.clients import FaultKind, WorkerFault, WorkerJob
from router.fleet.grpc_clients import GrpcWorkerClients
from router.flow.stream import Pumped
from tests.helpers.waiting import async_wait_until
from tests.worker.pair import settle
from tests.worker.served import Served, served

pytestmark = pytest.mark.timeout(180)

PROMPT = tuple(range(5, 13))
OWNER = Owner("a", "story")
HELD_TOKENS = 400  # still streaming when the test acts on it, at any speed of the tiny model
LONG_GRACE_S = 600.0  # never reached in a test: what ends a request there is not the grace


def _job(max_tokens: int, owner: Owner = OWNER, reattachable: bool = True) -> WorkerJob:
    return WorkerJob("story@1.x", PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                     Priority.NORMAL, 10.0, owner=owner, reattachable=reattachable)


def _attach_job(attempt: str, max_tokens: int, owner: Owner = OWNER) -> WorkerJob:
    return WorkerJob(attempt, PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                     Priority.NORMAL, 10.0, owner=owner, reattachable=True)


async def _read(call: Pumped, count: int) -> list[int]:
    """At least `count` tokens (those of the steps that brought them)."""
    tokens: list[int] = []
    while len(tokens) < count:
        event = await asyncio.wait_for(call.next(), 30)
        if isinstance(event, Tokens):
            tokens.extend(event.token_ids)
    return tokens


async def _rest(call: Pumped) -> tuple[Attached, list[int]]:
    """An attach call to its end: Attached first, then tokens, Finished last."""
    attached = await asyncio.wait_for(call.next(), 30)
    assert isinstance(attached, Attached)
    tokens: list[int] = []
    while True:
        event = await asyncio.wait_for(call.next(), 30)
        if isinstance(event, Finished):
            return attached, tokens
        if isinstance(event, Tokens):
            tokens.extend(event.token_ids)


async def _router(feeds: bool = True) -> GrpcWorkerClients:
    return GrpcWorkerClients(ChannelPool(), feeds=feeds)


async def _dies_after_tokens(worker: Served, max_tokens: int, feeds: bool, count: int = 3) -> list[int]:
    """A router opens the request, reads `count` tokens and dies (its channels close, no Abort)."""
    a = await _router(feeds)
    call = Pumped(a.decode(worker.address).open(_job(max_tokens), True), worker.address)
    seen = await _read(call, count)
    await a.channels.close()
    return seen


async def _ended(worker: Served) -> int:
    """Once every request ended here (its call's end is the worker's to see): the blocks still active."""
    await async_wait_until(lambda: len(worker.worker.live) == 0, 30, "every request ended on the worker")
    return await settle(worker.worker.engine)


async def _taken_on(worker: Served, max_tokens: int, feeds: bool = True) -> tuple[HeldAttempt, Attached, list[int]]:
    """Another router finds the one attempt of OWNER there and attaches it to its end."""
    b = await _router(feeds)
    try:
        (held,) = await b.decode(worker.address).find(OWNER, prompt_digest(PROMPT), 5)
        call = Pumped(b.decode(worker.address).attach(_attach_job(held.request_id, max_tokens)), worker.address)
        attached, rest = await _rest(call)
        call.close()
        return held, attached, rest
    finally:
        await b.channels.close()


def _alone(loaded, max_tokens: int) -> list[int]:
    async def main():
        async with served(loaded) as worker:
            router = await _router()
            job = _job(max_tokens, reattachable=False)
            call = Pumped(router.decode(worker.address).open(job, True), worker.address)
            try:
                tokens = await _read(call, max_tokens)
                assert isinstance(await call.next(), Finished)
                return tokens
            finally:
                call.close()
                await router.channels.close()

    return asyncio.run(main())


@pytest.mark.parametrize("feeds", [True, False])
def test_a_request_whose_router_died_decodes_on_and_another_router_attaches_it_with_every_token_once(
        tiny_llama, feeds):
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            seen = await _dies_after_tokens(worker, 64, feeds)
            await async_wait_until(lambda: any(h.orphaned for h in worker.worker.orphans.find(OWNER, prompt_digest(PROMPT))),
                                   30, "the request orphaned")
            held, attached, rest = await _taken_on(worker, 64, feeds)
            return seen, held, attached, rest, await _ended(worker)

    seen, held, attached, rest, left = asyncio.run(main())
    whole = list(attached.token_ids) + rest
    assert held.attachable and held.orphaned and attached.attachment == 1
    assert whole[:len(seen)] == seen and whole == _alone(tiny_llama, 64)
    assert left == 0


def test_an_orphan_that_finished_during_the_grace_gives_its_tokens_and_its_end_to_the_attach(tiny_llama):
    """Its blocks are freed as it finishes; its tokens and its end are kept for the grace."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            await _dies_after_tokens(worker, 24, True, count=1)
            await async_wait_until(lambda: len(worker.worker.live) == 0 and len(worker.worker.orphans.done) == 1, 60,
                                   "the orphan finished")
            _, attached, rest = await _taken_on(worker, 24)
            left = await _ended(worker)
            return attached, rest, len(worker.worker.orphans.done), left

    attached, rest, kept, left = asyncio.run(main())
    assert list(attached.token_ids) == _alone(tiny_llama, 24) and rest == [] and left == 0
    assert kept == 1  # replayed, and kept for the grace all the same (whether it was delivered is not known)


def test_the_grace_passing_aborts_the_orphan_and_frees_its_blocks(tiny_llama):
    """The grace's timer, fired by the test the moment the request is orphaned (so it is still
    decoding: one that finishes leaves the lease at once)."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            a = await _router()
            call = Pumped(a.decode(worker.address).open(_job(HELD_TOKENS), True), worker.address)
            await _read(call, 1)
            await a.channels.close()
            await async_wait_until(lambda: _expire_orphans(worker), 30, "the request orphaned")
            found = worker.worker.orphans.find(OWNER, prompt_digest(PROMPT))
            return found, await settle(worker.worker.engine), len(worker.worker.live), worker.worker.leases.ends

    found, left, live, ends = asyncio.run(main())
    assert found == [] and left == 0 and live == 0 and ends[LeaseKind.ORPHAN, Reclaim.EXPIRED] == 1


def _expire_orphans(worker: Served) -> bool:
    """The grace's end, now, for every orphan (whether there was one)."""
    graces = [r.progress.grace for r in worker.worker.live.records() if r.progress.grace is not None]
    for grace in graces:
        grace.end(Reclaim.EXPIRED)
    return bool(graces)


def test_after_the_grace_nothing_of_the_request_is_left_however_it_ended_meanwhile(tiny_llama):
    """The grace's own timer: the orphan expired still decoding, or finished first and was
    forgotten when its grace passed; either way nothing is found, nothing held."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=0.5) as worker:
            await _dies_after_tokens(worker, HELD_TOKENS, True)
            leases = worker.worker.leases
            kinds = (LeaseKind.ORPHAN, LeaseKind.RESULT)  # (a result: it finished first)
            await async_wait_until(lambda: any(leases.ends[kind, Reclaim.EXPIRED] for kind in kinds)
                                   and not any(leases.live(kind) for kind in kinds), 60, "the grace over")
            found = worker.worker.orphans.find(OWNER, prompt_digest(PROMPT))
            return found, await settle(worker.worker.engine), len(worker.worker.live)

    found, left, live = asyncio.run(main())
    assert found == [] and left == 0 and live == 0


@pytest.mark.parametrize("reattachable,grace_s", [(False, LONG_GRACE_S), (True, 0.0)])
def test_without_reattach_a_broken_call_ends_its_request_at_once(tiny_llama, reattachable, grace_s):
    """Not reattachable (a sample of n, a canary, a router that ends by closing), or a grace of 0."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=grace_s) as worker:
            a = await _router()
            call = Pumped(a.decode(worker.address).open(_job(HELD_TOKENS, reattachable=reattachable), True),
                          worker.address)
            await _read(call, 1)
            await a.channels.close()
            await async_wait_until(lambda: len(worker.worker.live) == 0, 30, "the request ended")
            return await settle(worker.worker.engine), worker.worker.leases.live(LeaseKind.ORPHAN)

    left, orphans = asyncio.run(main())
    assert left == 0 and orphans == 0


def test_a_call_its_router_closes_ends_its_request_with_an_abort_not_an_orphan(tiny_llama):
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            a = await _router()
            try:
                call = Pumped(a.decode(worker.address).open(_job(HELD_TOKENS), True), worker.address)
                await _read(call, 1)
                call.close()  # its client went away: the router ends it on purpose
                await async_wait_until(lambda: len(worker.worker.live) == 0, 30, "the request ended")
            finally:
                await a.channels.close()
            return await settle(worker.worker.engine), worker.worker.leases.ends[LeaseKind.ORPHAN, Reclaim.EXPIRED]

    left, expired = asyncio.run(main())
    assert left == 0 and expired == 0


def test_an_attach_takes_the_request_from_a_router_that_still_drives_it_whose_abort_then_misses(tiny_llama):
    """A router that only stalled: its call ends TAKEN, and its later Abort (of its own anchor)
    leaves the request to the router that attached it."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            a, b = await _router(), await _router()
            try:
                first = Pumped(a.decode(worker.address).open(_job(96), True), worker.address)
                seen = await _read(first, 2)
                (held,) = await b.decode(worker.address).find(OWNER, prompt_digest(PROMPT), 5)
                call = Pumped(b.decode(worker.address).attach(_attach_job(held.request_id, 96)), worker.address)
                attached = await asyncio.wait_for(call.next(), 30)
                taken = await _fault(first)
                first.close()  # sends an Abort of anchor 0: no longer this router's
                rest = [*attached.token_ids]
                while not isinstance(event := await asyncio.wait_for(call.next(), 30), Finished):
                    rest.extend(event.token_ids if isinstance(event, Tokens) else ())
                call.close()
            finally:
                await a.channels.close()
                await b.channels.close()
            return seen, taken, rest, await _ended(worker)

    seen, taken, whole, left = asyncio.run(main())
    assert taken.kind is FaultKind.TAKEN
    assert whole[:len(seen)] == seen and whole == _alone(tiny_llama, 96)
    assert left == 0


def test_another_tenants_request_of_that_id_is_neither_found_nor_attached(tiny_llama):
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            seen = await _dies_after_tokens(worker, HELD_TOKENS, True)
            b = await _router()
            other = Owner("b", OWNER.request_id)
            try:
                found = await b.decode(worker.address).find(other, prompt_digest(PROMPT), 5)
                another_prompt = await b.decode(worker.address).find(OWNER, prompt_digest(PROMPT[1:]), 5)
                (held,) = await b.decode(worker.address).find(OWNER, prompt_digest(PROMPT), 5)
                call = Pumped(b.decode(worker.address).attach(_attach_job(held.request_id, HELD_TOKENS, other)),
                              worker.address)
                refused = await _fault(call)
                call.close()
                assert await b.decode(worker.address).abort_attempt(held.request_id, held.attachment, 5)
            finally:
                await b.channels.close()
            return seen, found, another_prompt, refused, await settle(worker.worker.engine)

    seen, found, another_prompt, refused, left = asyncio.run(main())
    assert seen and found == [] and another_prompt == []
    assert refused.kind is FaultKind.LOST and left == 0


async def _fault(call: Pumped) -> WorkerFault:
    while True:
        try:
            await asyncio.wait_for(call.next(), 30)
        except WorkerFault as fault:
            return fault


def test_a_request_that_finished_while_its_router_stalled_is_attached_finished(tiny_llama):
    """Its router stopped reading (as a SIGSTOPped one does) while it ran to its end here: another
    router finds it finished, with every token, for the grace."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            a, b = await _router(), await _router()
            try:
                call, held, again = await _finished_then_attached(worker, a, b)
                attached, rest = await _rest(again)
                again.close()
                call.close()
            finally:
                await a.channels.close()
                await b.channels.close()
            return held, attached, rest, len(worker.worker.orphans.done)

    held, attached, rest, kept = asyncio.run(main())
    assert held.attachable and list(attached.token_ids) == _alone(tiny_llama, 24) and rest == [] and kept == 1


def test_a_finished_request_replayed_to_a_router_that_let_it_go_undelivered_replays_whole_again(tiny_llama):
    """The router it was replayed to let it go before its end (its client left: a backed-up feed
    delays a replay past an OpenAI client's read timeout) and sent its Abort: the result stays for
    the grace, and the client's next try, through a third router, gets it whole."""
    async def main():
        async with served(tiny_llama, reattach_grace_s=LONG_GRACE_S) as worker:
            a, b, c = await _router(), await _router(), await _router()
            try:
                call, held, first = await _finished_then_attached(worker, a, b)
                replayed = await asyncio.wait_for(first.next(), 30)
                first.close()
                aborted = worker.worker.orphans.abort(held.request_id, replayed.attachment)  # its router's Abort
                (again,) = await c.decode(worker.address).find(OWNER, prompt_digest(PROMPT), 5)
                second = Pumped(c.decode(worker.address).attach(_attach_job(held.request_id, 24)), worker.address)
                attached, rest = await _rest(second)
                second.close()
                call.close()
            finally:
                for router in (a, b, c):
                    await router.channels.close()
            return replayed, aborted, again, attached, rest

    replayed, aborted, again, attached, rest = asyncio.run(main())
    assert isinstance(replayed, Attached) and aborted and again.attachable
    assert attached.attachment == replayed.attachment + 1
    assert list(attached.token_ids) == _alone(tiny_llama, 24) and rest == []


async def _finished_then_attached(worker: Served, a: GrpcWorkerClients,
                                  b: GrpcWorkerClients) -> tuple[Pumped, HeldAttempt, Pumped]:
    """Router a's request of 24 tokens run to its end while a reads nothing (as a stalled router),
    found by router b and attached there: a's call, what b found, b's attach call."""
    call = Pumped(a.decode(worker.address).open(_job(24), True), worker.address)
    await async_wait_until(lambda: len(worker.worker.orphans.done) == 1, 60, "the request finished")
    (held,) = await b.decode(worker.address).find(OWNER, prompt_digest(PROMPT), 5)
    return call, held, Pumped(b.decode(worker.address).attach(_attach_job(held.request_id, 24)), worker.address)
