"""Canaries: a fixed greedy prompt through every prefill-decode pair, at the router's start and then
every `interval_s`, so a pair that computes wrong tokens (a bad device, a bit flip in its weights)
is found though its identity agrees.

    round: every usable pair (identities agree), one after another, as BATCH requests pinned to
           their pair (Job.pin: no retry elsewhere, no admission), each its own greedy tokens
    reference: the first round's most common answer (kept for the router's life); a first round
           without a strict majority sets none, and the next round tries again
    a pair whose answer differs: out of rotation (WorkerPool.quarantine_pair: no request is placed
           on it), an error log line, pdserve_canaries_total{outcome="differ"}; a later round that
           agrees puts it back. A canary that fails (a fault) judges nothing: faults have their
           own handling.

A canary is one short request at the lowest class: it never preempts real traffic and, one pair at
a time, adds at most one request to the fleet's load.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.requests import Priority, SamplingParams
from router.fleet.workers import WorkerPool
from router.flow.flow import RequestFlow
from router.flow.flow_types import Job, NewTokens

log = logging.getLogger(__name__)
CANARY_TEXT = "Count from one to ten, then name three primary colours."
Pair = tuple[str, str]  # (prefill address, decode address)


@dataclass(frozen=True)
class CanaryConfig:
    interval_s: float | None = 60.0  # between rounds (None: no canaries)
    max_tokens: int = 8
    timeout_s: float = 60.0  # one canary's deadline


class Canaries:
    def __init__(self, pool: WorkerPool, flow: RequestFlow, prompt: tuple[int, ...], config: CanaryConfig,
                 count: Callable[[str], None] = lambda outcome: None):
        """`prompt`: the canary's token ids; `count(outcome)`: agree, differ or failed, per canary."""
        self.pool = pool
        self.flow = flow
        self.prompt = prompt
        self.config = config
        self.count = count
        self.reference: tuple[int, ...] | None = None
        self._task: asyncio.Task | None = None

    def pairs(self) -> list[Pair]:
        """Every usable prefill-decode pair whose identities agree (quarantined ones included: a
        round may put them back)."""
        decode = self.pool.of_role("decode")
        return [(p.address, d.address) for p in self.pool.of_role("prefill") for d in decode if p.pairs_with(d)]

    async def round(self) -> dict[Pair, tuple[int, ...] | None]:
        """One canary through each pair, then the verdicts; each pair's answer (None: it failed)."""
        answers = {pair: await self._one(pair) for pair in self.pairs()}
        if self.reference is None:
            self.reference = _majority([a for a in answers.values() if a is not None])
            if self.reference is None and answers:
                log.warning("canaries: no answer agreed by a majority of %d pairs yet; none judged", len(answers))
        for pair, answer in answers.items():
            self._judge(pair, answer)
        return answers

    def _judge(self, pair: Pair, answer: tuple[int, ...] | None) -> None:
        if answer is None or self.reference is None:
            self.count("failed" if answer is None else "unjudged")
            return
        wrong = answer != self.reference
        self.count("differ" if wrong else "agree")
        if wrong and pair not in self.pool.quarantined:
            log.error("canary: the pair %s -> %s answered %s, the reference is %s: out of rotation", pair[0], pair[1],
                      list(answer), list(self.reference))
        elif not wrong and pair in self.pool.quarantined:
            log.warning("canary: the pair %s -> %s agrees again: back in rotation", pair[0], pair[1])
        if wrong != (pair in self.pool.quarantined):
            self.pool.quarantine_pair(*pair, wrong)

    async def _one(self, pair: Pair) -> tuple[int, ...] | None:
        job = Job(f"canary-{secrets.token_hex(6)}", self.prompt,
                  SamplingParams(max_tokens=self.config.max_tokens, temperature=0.0, ignore_eos=True), Priority.BATCH,
                  deadline=time.monotonic() + self.config.timeout_s, tenant="canary", pin=pair)
        tokens: list[int] = []
        try:
            async for event in self.flow.run(job):
                if isinstance(event, NewTokens):
                    tokens.extend(event.token_ids)
        except Exception as exc:  # a fault of the pair: not a verdict on its answers
            log.info("canary on %s -> %s failed: %s", pair[0], pair[1], exc)
            return None
        return tuple(tokens)

    def start(self) -> None:
        if self.config.interval_s is not None:
            self._task = asyncio.ensure_future(self._forever(self.config.interval_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _forever(self, interval_s: float) -> None:
        while True:
            if self.pairs():
                try:
                    await self.round()
                except Exception:  # a round must never end the loop
                    log.exception("canary round failed")
                await asyncio.sleep(interval_s)
            else:
                await asyncio.sleep(0.5)


def _majority(answers: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The answer more than half agree on; None without one."""
    if not answers:
        return None
    answer, votes = collections.Counter(answers).most_common(1)[0]
    return answer if votes * 2 > len(answers) else None
