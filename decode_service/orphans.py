"""A decode worker's requests whose router went away, kept for another router to attach.

    the request's call (Decode, or an Attach) or its router's event feed breaks without an Abort
        reattachable, decoding here (its KV in, or prefilled here): orphaned, for grace_s (a lease)
        else (waiting for KV a prefill worker sends: its router, who drove that, is gone): ended
    Find(owner, prompt digest)   its attempts here, with their tokens so far (`HeldAttempt`)
    Attach(attempt, owner)       a new call drives it: Attached(tokens so far), then its events;
                                 a call still driving it (a router that only stalled) ends TakenOver
    Abort(attempt, attachment)   ends it, unless another router attached it since (a later anchor)
    the grace passes             aborted, its blocks freed
    it finishes                  its tokens and end kept for the grace (`FinishedAttempts`: 4 bytes a
                                 token, no block; a lease too), as an orphan's are: a router that only
                                 stalled never got the end its call carried, and this worker cannot
                                 tell that it did; for the same reason neither an Attach that replays
                                 it nor its router's Abort ends it before the grace (the router it was
                                 replayed to may never deliver it: its client comes back once more)

An orphan decodes on: its memory is the KV blocks it holds anyway (plus a block per 16 tokens),
a row more in a decode step costs little beside the step's fixed cost, and a client that comes
back finds the tokens made meanwhile ready (replayed at once) instead of waiting for the request
to be admitted again. Its tokens are ids in `Progress`, kept whatever reads them; one that
finishes holds only those until the grace ends. Runs on the event loop.
"""

from __future__ import annotations

import array
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pdserve.aborts import Owner
from pdserve.reattach import HeldAttempt
from pdserve.rpc.errors import NotFound, TakenOver
from pdserve.worker.events import Attached, Finished
from pdserve.worker.feed import Feed
from pdserve.worker.leases import Lease, LeaseKind, Leases, Reclaim
from pdserve.worker.live import LiveRequests
from pdserve.worker.session import Ending, Observer, Session

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Progress:
    """What a request made here, kept whatever reads it: every token (resumed ones first, 4 bytes
    each), its end."""

    tokens: array.array
    finished: Finished | None = None
    attachment: int = 0  # its anchor now: the Decode call 0, each Attach the next
    grace: Lease | None = None  # while orphaned


class Orphanable(Protocol):
    """What the table asks of a decode worker's record (decode_service/worker.py `_Live`)."""

    session: Session
    progress: Progress

    @property
    def driven_here(self) -> bool:
        """It decodes without its router (its KV is in, or it prefills here)."""

    @property
    def reattachable(self) -> bool: ...

    @property
    def digest(self) -> bytes:
        """Its prompt's (pdserve/reattach.py prompt_digest)."""

    @property
    def kv_tokens(self) -> int:
        """Tokens whose KV it holds (its prompt and its tokens so far)."""


R = TypeVar("R", bound=Orphanable)


@dataclass(frozen=True)
class GraceConfig:
    grace_s: float
    block_size: int  # a lease's blocks are the request's, counted in tokens
    max_finished: int = 4096  # finished requests kept at most (the oldest forgotten first)


@dataclass(eq=False)
class _Done:
    """A finished reattachable request, kept for the grace (its lease: RESULT, no block)."""

    owner: Owner
    digest: bytes
    tokens: array.array
    finished: Finished
    attachment: int
    lease: Lease | None = None


class FinishedAttempts:
    """Finished requests by attempt id, each for `grace_s`, at most `max_finished` of them (the
    oldest forgotten first)."""

    def __init__(self, leases: Leases, config: GraceConfig):
        self.leases = leases
        self.config = config
        self._done: OrderedDict[str, _Done] = OrderedDict()

    def keep(self, request_id: str, record: Orphanable) -> None:
        progress = record.progress
        done = _Done(record.session.owner, record.digest, progress.tokens, progress.finished, progress.attachment)
        self._drop(request_id)
        self._done[request_id] = done
        done.lease = self.leases.grant(LeaseKind.RESULT, f"result of {request_id}", 0, self.config.grace_s,
                                       lambda _: self._forget(request_id, done))
        while len(self._done) > self.config.max_finished:
            self._drop(next(iter(self._done)))

    def replay(self, request_id: str, owner: Owner) -> _Done | None:
        """The owner's finished attempt, for an Attach that replays it: kept (whether that call
        delivers it is not known here), its anchor the Attach's from now on."""
        done = self._done.get(request_id)
        if done is None or done.owner != owner:
            return None
        done.attachment += 1
        return done

    def of(self, owner: Owner, digest: bytes) -> list[HeldAttempt]:
        return [HeldAttempt(i, tuple(d.tokens), True, True, d.attachment)
                for i, d in self._done.items() if d.owner == owner and d.digest == digest]

    def _drop(self, request_id: str) -> None:
        """The attempt forgotten now, its lease ended (kept again, or the oldest of too many)."""
        done = self._done.pop(request_id, None)
        if done is not None:
            done.lease.end()

    def holds(self, request_id: str, attachment: int) -> bool:
        done = self._done.get(request_id)
        return done is not None and done.attachment == attachment

    def __len__(self) -> int:
        return len(self._done)

    def _forget(self, request_id: str, done: _Done) -> None:
        if self._done.get(request_id) is done:
            del self._done[request_id]


class Orphans(Generic[R]):
    def __init__(self, live: LiveRequests[R], leases: Leases, config: GraceConfig):
        self.live = live
        self.leases = leases
        self.config = config
        self.stopping = False  # the worker stops: nothing is orphaned any more
        self.done = FinishedAttempts(leases, config)

    def orphan(self, session: Session) -> bool:
        """The session's call broke without an Abort: keep its request for the grace if it may be
        (True), else the caller ends it (False)."""
        record = self.live.get(session.request_id)
        if (record is None or record.session is not session or session.ending is Ending.FINISHED
                or not self._keeps(record)):
            return False
        log.info("request %s orphaned after %d tokens: kept %.0f s for a re-attach", session.request_id,
                 len(record.progress.tokens), self.config.grace_s)
        session.orphan()
        blocks = -(-record.kv_tokens // self.config.block_size)
        record.progress.grace = self.leases.grant(LeaseKind.ORPHAN, f"orphan {session.request_id}", blocks,
                                                  self.config.grace_s, lambda reason: self._grace_over(record, reason))
        return True

    def find(self, owner: Owner, digest: bytes) -> list[HeldAttempt]:
        return [HeldAttempt(r.session.request_id, tuple(r.progress.tokens), r.reattachable and r.driven_here,
                            r.progress.grace is not None, r.progress.attachment)
                for r in self.live.records() if r.session.owner == owner and r.digest == digest
                ] + self.done.of(owner, digest)

    def attach(self, request_id: str, owner: Owner, feed: Feed | None, observe: Observer | None) -> Session:
        """A new call drives the request from now on: Attached (its tokens so far) is its first
        event, then Finished if it ended meanwhile. NotFound unless it is the owner's and attachable."""
        record = self.live.get(request_id)
        if record is None and (done := self.done.replay(request_id, owner)) is not None:
            return _replayed(Session(request_id, owner, feed, observe), done)
        if record is None or record.session.owner != owner or not (record.reattachable and record.driven_here):
            raise NotFound(f"no attachable request {request_id!r} of {owner.request_id!r} is held here")
        previous, progress = record.session, record.progress
        log.info("request %s attached after %d tokens (%s)", request_id, len(progress.tokens),
                 "orphaned" if progress.grace is not None else "taken from the call driving it")
        record.session = Session(request_id, owner, feed, observe)
        progress.attachment += 1
        if progress.grace is not None:
            progress.grace, grace = None, progress.grace
            grace.end()
        else:
            previous.fail(TakenOver(f"request {owner.request_id} was attached through another router"))
            previous.detach()
        record.session.push(Attached(tuple(progress.tokens), progress.attachment))
        if progress.finished is not None:
            record.session.push(progress.finished)
        return record.session

    def abort(self, request_id: str, attachment: int) -> bool:
        """Abort by its router (the attempt's anchor `attachment`): whether it was held and still that router's."""
        record = self.live.get(request_id)
        if record is None:  # finished: kept for the grace all the same (the class's docstring)
            return self.done.holds(request_id, attachment)
        if record.progress.attachment != attachment:
            return False
        return self.live.abort(request_id)

    def finished(self, record: R) -> None:
        """The engine finished the request (`progress.finished` set): an orphan ends now (kept as finished)."""
        if record.progress.grace is not None:
            self.live.end(record, abort=False)

    def ended(self, record: R) -> None:
        """The request ended here (however): its grace, if orphaned, is over; finished, it is kept."""
        if record.progress.grace is not None:
            record.progress.grace, grace = None, record.progress.grace
            grace.end()
        if record.progress.finished is not None and self._may_keep(record):
            self.done.keep(record.session.request_id, record)

    def stop(self) -> None:
        """The worker stops: no router could attach; every orphan ends now."""
        self.stopping = True
        for record in self.live.records():
            if record.progress.grace is not None:
                self._expire(record)

    def _keeps(self, record: R) -> bool:
        return self._may_keep(record) and record.driven_here

    def _may_keep(self, record: R) -> bool:
        return self.config.grace_s > 0 and not self.stopping and record.reattachable

    def _grace_over(self, record: R, reason: Reclaim) -> None:
        if reason is Reclaim.EXPIRED:  # (ENDED: attached, or it ended otherwise)
            self._expire(record)

    def _expire(self, record: R) -> None:
        """Nobody attached it in time: aborted (a finished one only let go), its blocks freed."""
        if self.live.get(record.session.request_id) is record:
            self.live.end(record, abort=record.progress.finished is None)


def _replayed(session: Session, done: _Done) -> Session:
    """A finished request's whole stream at once: its tokens, then its end."""
    session.push(Attached(tuple(done.tokens), done.attachment))
    session.push(done.finished)
    session.detach()
    return session
