"""Several samples of one prompt (OpenAI's `n` and `best_of`), the prompt's KV moved and held once:

    sample 0         placed as any request: a prefill worker computes the prompt, its KV goes to a
                     decode worker D, whose prefix cache takes the prompt's full blocks as they land
    samples 1..k-1   started once sample 0 streams from D (its second token, or its end), placed on
                     D (Job.beside) and prefilled there: the prompt's full blocks are D's cached ones,
                     shared by reference count, so each computes only the prompt's last partial
                     block and holds its own copy of it from there (where the samples diverge)
    seeds            sample i samples with seed + i (unseeded: each its own stream)
    prompt logprobs  computed for sample 0 alone (the prompt is one)
    best_of > n      every sample asks for its tokens' log-probabilities; once all end, the n whose
                     tokens' log-probabilities sum highest are the answer, in that order

A fault in any sample is handled for it alone (its retry or resume is placed anew); an error that
ends one ends the request. Cancelling the request cancels every sample; so does one sample's end by
an Abort sent to another router (finish ABORT: router/doors/aborting.py), and later ones never start.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from pdserve.requests import FinishReason
from router.doors.asks import SampleCount
from router.flow.flow import RequestFlow
from router.flow.flow_types import Done, Job, Milestone, NewTokens

def sample_job(first: Job, index: int, decode: str | None) -> Job:
    """Sample `index` of `first`'s prompt, beside its decode worker (None: placed as any request)."""
    seed = None if first.sampling.seed is None else first.sampling.seed + index
    return dataclasses.replace(first, request_id=f"{first.request_id}/{index}", beside=decode,
                               client_id=first.owner.request_id,
                               sampling=dataclasses.replace(first.sampling, seed=seed, prompt_logprobs=None))


class Samples:
    """Runs every sample of a request; each event goes to `put(index, event)`, and each sample's
    run ends with a None event or the exception that ended it."""

    def __init__(self, flow: RequestFlow, first: Job, count: SampleCount,
                 put: Callable[[int, object], None]):
        self.flow = flow
        self.first = first
        self.count = count
        self.put = put
        self.tasks: dict[int, asyncio.Task] = {}
        self._decode: str | None = None  # sample 0's decode worker, from its placements
        self._streamed = 0  # sample 0's token events
        self._started = asyncio.Event()
        self._aborted = False  # a sample ended by its client's Abort through another router

    async def run(self) -> None:
        """Until every sample ended; cancelled, it cancels them all."""
        try:
            self.tasks[0] = asyncio.ensure_future(self._one(0, self.first))
            await self._started.wait()
            for i in range(1, self.count.drawn):
                if self._aborted:
                    self.put(i, asyncio.CancelledError())
                    continue
                self.tasks[i] = asyncio.ensure_future(self._one(i, sample_job(self.first, i, self._decode)))
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        finally:
            for task in self.tasks.values():
                task.cancel()

    def stop(self, index: int) -> None:
        """End one sample (a stop string ended its text)."""
        task = self.tasks.get(index)
        if task is not None:
            task.cancel()

    async def _one(self, index: int, job: Job) -> None:
        try:
            async for event in self.flow.run(job):
                if index == 0:
                    self._watch(event)
                self.put(index, event)
                if isinstance(event, Done) and event.reason is FinishReason.ABORT:
                    self._abort_others(index)
            self.put(index, None)
        except BaseException as exc:
            self.put(index, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._started.set()  # sample 0 ended (or failed): the others start now, wherever placed

    def _abort_others(self, index: int) -> None:
        self._aborted = True
        for i, task in self.tasks.items():
            if i != index:
                task.cancel()

    def _watch(self, event) -> None:
        if isinstance(event, Milestone) and event.name == "placement":
            self._decode = event.attributes.get("pdserve.decode_worker")
        elif isinstance(event, NewTokens):
            self._streamed += 1
            if self._streamed >= 2:  # its decode worker holds the prompt's KV, cached
                self._started.set()
        elif isinstance(event, Done):
            self._started.set()


def best(totals: dict[int, float], n: int) -> list[int]:
    """The indexes of the n highest sums of log-probabilities, best first (ties: lower index)."""
    return sorted(totals, key=lambda i: (-totals[i], i))[:n]
