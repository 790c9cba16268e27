"""Conditional disaggregation: when a decode worker prefills a request itself instead of
receiving its KV from a prefill worker. A policy: it reads numbers and never calls out.

Two reasons to stay local, checked in order:
- "cached": the decode worker already holds most of the prompt (an earlier turn of the
  conversation) and the rest is short: computing the rest there costs less than a round trip
  through a prefill worker, and nothing is sent. Unless the decode worker is busy (at least
  `busy_decode_requests` in flight) while a prefill worker is idle and would compute no more
  than `max_uncached_tokens` either (its own cache, probed): there the remainder would wait for
  a step shared with every running decode (and stretch their gaps), while the idle prefill
  worker starts at once and sends only the blocks past the decode worker's ("decode_busy").
- "prefill_busy": every usable prefill worker has a queue (requests in flight from this router,
  or waiting there by its last poll) of at least `busy_prefill_requests`, while the decode worker
  would compute only a short remainder: the remote path would wait longer than the local one takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.fleet.workers import Worker


@dataclass(frozen=True)
class LocalPrefillDecision:
    local: bool
    reason: str  # "cached", "prefill_busy", "resume" (no prefill worker usable), "link_out" (no KV link to it
    # in rotation, router/fleet/links.py), or why not: "remote", "resume_remote"


REMOTE = LocalPrefillDecision(False, "remote")
RESUME_REMOTE = LocalPrefillDecision(False, "resume_remote")  # a resume's prompt and tokens so far, by a prefill worker
DECODE_BUSY = LocalPrefillDecision(False, "decode_busy")


@dataclass(frozen=True)
class LocalPrefillPolicy:
    max_uncached_tokens: int = 256  # the most a decode worker computes of a prompt (0: never locally)
    min_cached_fraction: float = 0.5  # of the prompt the decode worker must hold, for "cached"
    busy_prefill_requests: int = 0  # a prefill worker's queue that makes it "busy" (0: never, the default)
    busy_decode_requests: int = 0  # a decode worker's requests in flight that make it "busy" (0: never, the default)

    def decide(self, prompt_tokens: int, decode_cached: int, decode: Worker, prefill_workers: Sequence[Worker],
               prefill_cached: Mapping[str, int] | None = None) -> LocalPrefillDecision:
        """`prefill_cached`: what the idle prefill workers hold of the prompt, when probed
        (see wants_prefill_probe); none probed: they hold nothing of it."""
        prefill_cached = prefill_cached or {}
        if not self._short(prompt_tokens - decode_cached):
            return REMOTE
        if self._mostly_cached(prompt_tokens, decode_cached):
            if self._busy(decode) and any(self._short(prompt_tokens - prefill_cached.get(w.address, 0))
                                          for w in self.idle(prefill_workers)):
                return DECODE_BUSY
            return LocalPrefillDecision(True, "cached")
        busy = self.busy_prefill_requests
        if busy > 0 and prefill_workers and all(_queue(w) >= busy for w in prefill_workers):
            return LocalPrefillDecision(True, "prefill_busy")
        return REMOTE

    def wants_prefill_probe(self, prompt_tokens: int, decode_cached: int, decode: Worker) -> bool:
        """Whether the decision turns on what idle prefill workers hold (a busy decode worker
        holding most of a prompt with a short rest)."""
        return (self._short(prompt_tokens - decode_cached) and self._mostly_cached(prompt_tokens, decode_cached)
                and self._busy(decode))

    @staticmethod
    def idle(prefill_workers: Sequence[Worker]) -> list[Worker]:
        return [w for w in prefill_workers if _queue(w) == 0]

    def _short(self, uncached: int) -> bool:
        return 0 < self.max_uncached_tokens and uncached <= self.max_uncached_tokens

    def _mostly_cached(self, prompt_tokens: int, decode_cached: int) -> bool:
        return decode_cached > 0 and decode_cached >= self.min_cached_fraction * prompt_tokens

    def _busy(self, decode: Worker) -> bool:
        return 0 < self.busy_decode_requests <= max(decode.assigned, decode.running)


def _queue(worker: Worker) -> int:
    """A worker's requests in flight: this router's (fresh) or its own count at the last poll."""
    return max(worker.assigned, worker.waiting)


def add_local_prefill_flags(p) -> None:
    """The router's flags for this policy (argparse); defaults from LocalPrefillPolicy."""
    d = LocalPrefillPolicy()
    g = p.add_argument_group("conditional disaggregation (the decode worker prefills a short remainder itself)")
    g.add_argument("--local-prefill-max-uncached", type=int, default=d.max_uncached_tokens,
                   help="most prompt tokens a decode worker computes itself (0: always a prefill worker)")
    g.add_argument("--local-prefill-min-cached-fraction", type=float, default=d.min_cached_fraction,
                   help="share of the prompt the decode worker must hold already (an earlier turn)")
    g.add_argument("--local-prefill-busy-requests", type=int, default=d.busy_prefill_requests,
                   help="a queue on every prefill worker that makes a short prompt stay local (0: never)")
    g.add_argument("--local-prefill-busy-decode-requests", type=int, default=d.busy_decode_requests,
                   help="requests in flight that make a decode worker send its cached remainder to an idle "
                        "prefill worker instead (0: never)")


def local_prefill_from_args(args) -> LocalPrefillPolicy:
    return LocalPrefillPolicy(args.local_prefill_max_uncached, args.local_prefill_min_cached_fraction,
                              args.local_prefill_busy_requests, args.local_prefill_busy_decode_requests)


def local_prefill_argv(args) -> list[str]:
    """The router's flags for this policy, from parsed ones (what `pdserve up` passes on)."""
    return ["--local-prefill-max-uncached", str(args.local_prefill_max_uncached),
            "--local-prefill-min-cached-fraction", str(args.local_prefill_min_cached_fraction),
            "--local-prefill-busy-requests", str(args.local_prefill_busy_requests),
            "--local-prefill-busy-decode-requests", str(args.local_prefill_busy_decode_requests)]
