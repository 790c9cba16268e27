"""A stream continued at this router (GenerateRequest.resume_from_token): who holds its request,
and how it goes on from where its client is (pdserve/reattach.py; the workers' side:
decode_service/orphans.py).

    Find(owner, prompt) on every decode worker, concurrently (each bounded by FIND_TIMEOUT_S)
    plan_reattach (policy, below)                       ATTACH    the attempt with most tokens that
                                                                  agrees with the client's: the next
                                                                  attempt attaches it (router/flow/flow.py)
                                                        RESUME    prefill the prompt and the client's
                                                                  tokens again (the resume path)
                                                        COMPLETE  the client has every token already
                                                        LOST      nobody holds it, and the client did
                                                                  not send its tokens: NOT_FOUND
    every other attempt of the owner found: aborted (the client is here now)

An attempt "agrees" when it holds at least the client's `from_token` tokens and they are the
client's (when it sent them). Attaching is for a request whose every token a worker can give
again (`Job.reattachable`: no log-probabilities); any other continues by RESUME.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from pdserve.reattach import HeldAttempt, prompt_digest
from pdserve.rpc.errors import NotFound, Unavailable
from router.doors.asks import Resume
from router.fleet.clients import WorkerClients
from router.fleet.workers import WorkerPool
from router.flow.flow_types import FlowEvent, FlowState, Job, Milestone, Resumed
from router.flow.protocol import Signal
from router.flow.recovery import RecoveryPolicy

FIND_TIMEOUT_S = 1.0  # each decode worker's answer to Find
FIND_TRIES = 3  # Finds of a usable decode worker that did not answer, before a stream is judged lost
ABORT_TIMEOUT_S = 1.0  # each Abort of an attempt found and not taken


class Way(enum.Enum):
    ATTACH = "attach"
    RESUME = "resume"
    LOST = "lost"


@dataclass(frozen=True)
class ReattachPlan:
    way: Way
    prior: tuple[int, ...] = ()  # the client's tokens (ATTACH, RESUME)
    attach: HeldAttempt | None = None  # ATTACH's attempt
    abandon: tuple[HeldAttempt, ...] = ()  # attempts found and not taken: aborted


def plan_reattach(held: Sequence[HeldAttempt], resume: Resume, may_attach: bool) -> ReattachPlan:
    """The table above, over what the decode workers answered."""
    n = resume.from_token
    agrees = [h for h in held if len(h.token_ids) >= n and (resume.prior is None or h.token_ids[:n] == resume.prior)]
    takers = [h for h in agrees if h.attachable] if may_attach else []
    if takers:
        chosen = max(takers, key=lambda h: len(h.token_ids))
        return ReattachPlan(Way.ATTACH, chosen.token_ids[:n], chosen, tuple(h for h in held if h is not chosen))
    prior = resume.prior if resume.prior is not None else agrees[0].token_ids[:n] if agrees else () if n == 0 else None
    if prior is None:
        return ReattachPlan(Way.LOST, abandon=tuple(held))
    return ReattachPlan(Way.RESUME, prior, abandon=tuple(held))


class Reattacher:
    def __init__(self, pool: WorkerPool, clients: WorkerClients, recovery: RecoveryPolicy):
        self.pool = pool
        self.clients = clients
        self.recovery = recovery
        self._aborts: set[asyncio.Task] = set()

    async def begin(self, job: Job, state: FlowState) -> AsyncIterator[FlowEvent]:
        """Where the continued stream `job` starts: Resumed (the client's tokens) and, when it
        attaches, `state.attach`; done at once when the client has every token. NotFound: LOST."""
        assert job.resume is not None
        now = time.monotonic()
        held, silent = await self.find(job, [w.address for w in self.pool.workers.values() if w.role == "decode"])
        plan = plan_reattach(held, job.resume, job.reattachable)
        for _ in range(FIND_TRIES - 1):  # lost only if every usable decode worker said so
            silent = [a for a in silent if a in self.pool.workers and self.pool.workers[a].usable(now)]
            if plan.way is not Way.LOST or not silent:
                break
            more, silent = await self.find(job, silent)
            held += more
            plan = plan_reattach(held, job.resume, job.reattachable)
        if plan.way is Way.LOST and silent:
            raise Unavailable(f"request {job.request_id!r}: decode workers {', '.join(silent)} did not answer "
                              "whether they hold it; try again", retry_after_s=FIND_TIMEOUT_S)
        self._abandon(plan.abandon)
        yield Milestone("reattach", {"pdserve.reattach": plan.way.value, "pdserve.resume_from_token":
                                     job.resume.from_token, "pdserve.held": len(held),
                                     "pdserve.decode_worker": plan.attach.address if plan.attach else None})
        if plan.way is Way.LOST:
            raise NotFound(f"request {job.request_id!r} after {job.resume.from_token} tokens is held by no decode "
                           f"worker ({_found(held)}: its grace passed, or its router went away before one decoded "
                           "it), and its tokens were not sent (prior_token_ids): it cannot go on; send it anew")
        state.generated = list(plan.prior)
        state.attach = plan.attach
        yield Resumed(plan.prior)
        if plan.attach is None and plan.prior and (reason := self.recovery.complete_reason(plan.prior, job.sampling)):
            state.protocol.advance(Signal.COMPLETE, "the client has every token")
            yield state.done(reason)

    async def find(self, job: Job, addresses: Sequence[str]) -> tuple[list[HeldAttempt], list[str]]:
        """What those decode workers hold of the job, and those that did not answer."""
        digest = prompt_digest(job.prompt)
        answers = await asyncio.gather(*(self.clients.decode(a).find(job.owner, digest, FIND_TIMEOUT_S)
                                         for a in addresses))
        return [h for answer in answers if answer for h in answer], [a for a, r in zip(addresses, answers) if r is None]

    def _abandon(self, held: Sequence[HeldAttempt]) -> None:
        for h in held:
            task = asyncio.ensure_future(self.clients.decode(h.address).abort_attempt(h.request_id, h.attachment,
                                                                                      ABORT_TIMEOUT_S))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)


def _found(held: Sequence[HeldAttempt]) -> str:
    if not held:
        return "none found"
    return "found: " + ", ".join(f"{h.request_id} with {len(h.token_ids)} tokens" for h in held)
