"""The decode worker beneath its servicer: reserves blocks, takes KV in, streams tokens.

    router --Decode--> open()          engine thread: add_remote -> schedule() reserves blocks
           <-- Reserved(block ids) --  on_step()
    prefill --PushKV--> push_kv()      receiver.expect(piece, secret) into exactly those blocks
    prefill --CompleteKV--> complete() all pieces in -> mark_received(first token) -> decoding
           <-- Tokens ... Finished --  on_step()
    router --Depart--> depart()        (this worker leaves) the request stops here with its KV held
           <-- Departed --             then router --MoveKV--> move_kv(): the KV goes to another
                                       decode worker's reservation (decode_service/departures.py)
    the router's call breaks           a reattachable request decoding here is orphaned for the
                                       grace; another router may Find and Attach it (orphans.py)

At tensor parallel size d every rank receives its own heads' share of each piece from every
prefill rank holding some of them (pdserve/parallel/kv_ranks.py); a piece is in once every
rank's share is.

Each reservation has a secret drawn here (in Reserved, for the prefill worker the router picks):
the servicer refuses PushKV and CompleteKV that do not present it (`presented`), and the
transport accepts the piece's data only under it.

Every exit (finish, cancel, abort, deadline, failed transfer) frees the request's blocks within
one step: the transfer is withdrawn first, then the engine aborts the request, unless the
engine finished it itself. Blocks a withdrawn receive may still write stay out of use as a
quarantine lease, until the transport says the receive is over or the lease's limit passes.
"""

from __future__ import annotations

import array
import asyncio
import functools
import hmac
import itertools
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from decode_service.departures import Departures, Moved
from decode_service.intake import Intake, Unsafe
from decode_service.orphans import GraceConfig, Orphans, Progress
from pdserve.aborts import Owner
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.config import DeadlineConfig
from pdserve.errors import ChecksumMismatch, InvalidRequestError
from pdserve.engine.outputs import RequestOutput, StepResult
from pdserve.kv import BlockHold
from pdserve.kv.page_groups import live_pairs
from pdserve.parallel.kv_ranks import RanksReceiver
from pdserve.reattach import prompt_digest
from pdserve.requests import Priority, Request, SamplingParams
from pdserve.rpc.bounds import check_id, check_timeout
from pdserve.rpc.errors import Withdrawn
from pdserve.transfer import KVReceiver
from pdserve.transfer.checksum import blocks_checksum_off_loop, summable
from pdserve.worker.commands import submit
from pdserve.worker.events import Departed, Finished, Preempted, Reserved, Tokens
from pdserve.worker.feed import Feed
from pdserve.worker.kv_out import Target
from pdserve.worker.leases import LeaseKind, Leases, Reclaim
from pdserve.worker.live import LiveRequests
from pdserve.worker.session import Observer, Session

log = logging.getLogger(__name__)
SECRET_BYTES = 16


@dataclass(frozen=True)
class Departure:
    """Depart's answer: whether the request left, its tokens then, or why it did not."""

    departed: bool
    generated: int
    reason: str = ""
    kv_kept: bool = False  # its KV waits for move_kv


@dataclass(frozen=True)
class DecodeJob:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    priority: Priority
    kv_timeout_s: float
    local_prefill: bool
    output_token_ids: tuple[int, ...] = ()
    age_s: float = 0.0  # since the router accepted it: queued as if it had arrived that long ago
    owner: Owner | None = None  # its client's request: an Abort of it through any router ends it
    reattachable: bool = False  # its router ends it only by an Abort: a broken call orphans it (orphans.py)


@dataclass(eq=False)
class _Live:
    """A request between open and its end (a LiveRequest). `request` is the engine's, bound when
    it was added, so step results of an earlier request under the same id never reach this one."""

    job: DecodeJob
    session: Session
    request: Request | None = None
    intake: Intake | None = None
    received: bool = False  # its KV is in (a remote request past CompleteKV)
    progress: Progress = field(default_factory=lambda: Progress(array.array("I")))

    def __post_init__(self) -> None:
        self.progress.tokens.extend(self.job.output_token_ids)

    @property
    def driven_here(self) -> bool:
        """It decodes without its router: its KV is in, or it prefills here."""
        return self.received or self.job.local_prefill

    @property
    def reattachable(self) -> bool:
        return self.job.reattachable and self.job.owner is not None

    @functools.cached_property
    def digest(self) -> bytes:
        return prompt_digest(self.job.prompt)

    @property
    def kv_tokens(self) -> int:
        return len(self.job.prompt) + len(self.progress.tokens)

    @property
    def unstarted(self) -> bool:
        """A remote request no KV piece has reached yet: redoing it elsewhere costs nothing here."""
        return not self.job.local_prefill and not self.received and (self.intake is None or not self.intake.pieces)


class DecodeWorker:
    def __init__(self, engine: AsyncEngine, receiver: KVReceiver | RanksReceiver | None, leases: Leases,
                 quarantine_timeout_s: float = DeadlineConfig().quarantine_timeout_s, releases_holds: bool = True,
                 departures: Departures | None = None, checksums: bool = True,
                 reattach_grace_s: float = DeadlineConfig().reattach_grace_s):
        """`receiver`: every rank's (a plain KVReceiver: this worker has one rank; None: no
        remote KV). `quarantine_timeout_s`: the longest blocks stay quarantined when the
        transport never says the withdrawn receive that may write them is over. `departures`:
        how its requests leave with their KV (None: they cannot; Depart gives their KV back).
        `checksums`: check the sums senders send with their KV (where this worker can: one rank,
        a host pool). `reattach_grace_s`: how long a reattachable request whose call broke
        decodes on for another router (0: ended at once)."""
        self.engine = engine
        self.receiver = receiver if receiver is None or isinstance(receiver, RanksReceiver) else RanksReceiver.alone(
            receiver, engine.engine.kv.shape.num_kv_heads)
        self.live: LiveRequests[_Live] = LiveRequests(engine, self._end)
        self.leases = leases
        self.orphans = Orphans(self.live, leases, GraceConfig(reattach_grace_s, engine.engine.kv.block_size))
        self.quarantine_timeout_s = quarantine_timeout_s
        self.intakes: dict[str, Intake] = {}  # transfer id -> its intake
        self._transfer_ids = itertools.count()  # a transfer id is never reused, even after a failure
        # A decode worker gives back the holds its steps produce; beside a prefill worker on one
        # engine (an elastic worker) that one does, since some are its sends'.
        self.releases_holds = releases_holds
        self.departures = departures if departures is not None else Departures(engine, None, None, 0, 0, leases)
        pool = engine.engine.kv.data
        self.verifies = checksums and self.receiver is not None and len(self.receiver.ports) == 1 and summable(pool)
        engine.add_listener(self.on_step)

    async def open(self, job: DecodeJob, feed: Feed | None = None, observe: Observer | None = None) -> Session:
        """`feed`: its router's event feed, which its events go by (pdserve/worker/feed.py);
        `observe`: sees each of them as it goes."""
        _check_job(job)
        self.live.check_free(job.request_id)
        if not job.local_prefill and self.receiver is None:
            raise InvalidRequestError("this worker takes no remote KV (colocated mode)")
        return await self.live.open(_Live(job, Session(job.request_id, job.owner, feed, observe)),
                                    lambda e: _add(e, job))

    def _end(self, live: _Live, abort: bool) -> None:
        """The request ended here (LiveRequests' end hook): withdraw the transfer, then (queued
        now, in order, whatever cancels the caller) abort in the engine if asked."""
        live.session.detach()
        self.orphans.ended(live)
        unsafe = self._drop_intake(live)
        if abort:
            request_id = live.job.request_id
            quarantined = submit(self.engine, lambda e: _abort(e, request_id, unsafe.blocks))
            quarantined.add_done_callback(lambda f: self._quarantine(request_id, f, unsafe))

    # ---- KV intake ----

    def presented(self, transfer_id: str, secret: bytes) -> bool:
        """Whether `secret` is the one drawn for the transfer (InvalidRequestError: no such transfer)."""
        return hmac.compare_digest(self._intake_of(transfer_id).secret, secret)

    def push_kv(self, transfer_id: str, seq: int, block_index: int, src_blocks: Sequence[int], timeout_s: float,
                senders: int = 1) -> None:
        """Post receives for one piece, sent by `senders` ranks; InvalidRequestError, with nothing
        changed, for a piece outside the reservation, overlapping another, a timeout outside
        (0, 600] s, or a sender size that does not divide the KV heads."""
        intake = self._intake_of(transfer_id)
        check_timeout("timeout_s", timeout_s)
        assert self.receiver is not None
        try:
            self.receiver.check_senders(senders)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        try:
            pairs = live_pairs(src_blocks, intake.block_ids[block_index:block_index + len(src_blocks)])
        except ValueError as exc:
            raise InvalidRequestError(f"piece {seq} of {transfer_id}: {exc}") from None
        intake.announce(seq, block_index, len(src_blocks))
        intake.lease.renew(intake.kv_timeout_s)
        task = asyncio.ensure_future(self.receiver.expect(transfer_id, seq, pairs, timeout_s, secret=intake.secret,
                                                          senders=senders))
        task.add_done_callback(lambda t: self._piece_done(intake, seq, t))
        intake.pieces[seq] = task

    async def complete_kv(self, transfer_id: str, num_pieces: int, first_token: int,
                          checksums: Sequence[int] = ()) -> None:
        """Decode once every piece landed, and summed as its sender did (`checksums`, one per
        piece; empty: unchecked): else ChecksumMismatch, and the request fails here before a
        step could read its blocks. InvalidRequestError, with nothing changed, unless the
        announced pieces are exactly 0..num_pieces-1, cover the reservation, and first_token is
        in the vocabulary."""
        intake = self._intake_of(transfer_id)
        vocab = self.engine.engine.limits.vocab_size
        if not 0 <= first_token < vocab:
            raise InvalidRequestError(f"first_token_id {first_token} is outside the vocabulary (size {vocab})")
        intake.check_complete(num_pieces)
        await asyncio.wait(intake.pieces.values())
        if self.intakes.get(transfer_id) is not intake:
            raise InvalidRequestError(f"transfer {transfer_id!r} was withdrawn (the request ended here)")
        if (error := intake.first_failure()) is not None:
            raise error
        live = self.live[intake.request_id]
        if checksums and self.verifies:
            try:
                await intake.check_sums(checksums)
            except ChecksumMismatch as mismatch:
                log.error("request %s: %s", intake.request_id, mismatch)
                self.live.fail(live, mismatch)
                raise
            if self.intakes.get(transfer_id) is not intake:
                raise InvalidRequestError(f"transfer {transfer_id!r} was withdrawn (the request ended here)")
        self._retire(live, intake)
        live.received = True
        live.progress.tokens.append(first_token)
        await submit(self.engine, lambda e: e.mark_received(intake.request_id, first_token))

    def withdraw_unstarted(self) -> int:
        """Give back every remote request no KV has reached yet (waiting for its reservation, or
        reserved with no piece announced): each stream ends with Withdrawn, so the router places
        it on another decode worker without charging this one. How many."""
        unstarted = [live for live in self.live.records() if live.unstarted]
        error = Withdrawn("this worker is leaving the decode role: the request goes to another decode worker")
        return sum(self.live.fail(live, error) for live in unstarted)

    # ---- departures (a move to another decode worker) ----

    async def depart(self, request_id: str, keep_kv_s: float | None, attachment: int = 0) -> Departure:
        """Stop a decoding request here between two steps: its stream gets every token generated
        so far, then Departed, and ends; its KV is kept for `move_kv` at most `keep_kv_s` (None:
        given back now). Refused (departed False, the request goes on) when it is not decoding, or
        not the caller's (`attachment`: its anchor; another router attached it since).
        NOTE: once asked of the engine, the departure completes whatever cancels the caller (a
        Depart that timed out): the engine's answer is settled by a callback, never lost."""
        live = self.live.get(request_id)
        if live is None or live.progress.attachment != attachment:
            return Departure(False, 0, f"no request {request_id!r} of the caller's is running here")
        if not (live.received or live.job.local_prefill):
            return Departure(False, 0, "its KV is still arriving")
        answer: asyncio.Future[Departure] = asyncio.get_running_loop().create_future()
        detaching = submit(self.engine, lambda e: e.detach(request_id))
        detaching.add_done_callback(lambda f: answer.set_result(self._departed(live, request_id, f, keep_kv_s)))
        return await asyncio.shield(answer)

    def _departed(self, live: _Live, request_id: str, detaching: asyncio.Future, keep_kv_s: float | None) -> Departure:
        """On the loop, as soon as the engine answered: keep or give back the KV, end the stream."""
        detached = None if detaching.cancelled() or detaching.exception() is not None else detaching.result()
        if detached is None:
            return Departure(False, 0, "it is not decoding now (queued, preempted or swapped out)")
        generated = len(detached.output_token_ids)
        if self.live.get(request_id) is not live:  # its stream ended meanwhile: nobody will move it
            self.departures.keep(request_id, detached, None)
            return Departure(True, generated)
        kept = self.departures.keep(request_id, detached, keep_kv_s)
        live.session.push(Departed(generated, kept))
        self.live.end(live, abort=False)
        return Departure(True, generated, kv_kept=kept)

    async def move_kv(self, request_id: str, target: Target) -> Moved:
        """Send a departed request's KV into another decode worker's reservation."""
        return await self.departures.move(request_id, target)

    def in_flight(self) -> int:
        """Requests it still serves, and departed ones whose KV waits for its move."""
        return len(self.live) + len(self.departures)

    def kv_rank_bytes(self) -> list[int]:
        """KV bytes each rank of this worker received, rank 0 first."""
        return [] if self.receiver is None else list(self.receiver.rank_bytes)

    def _intake_of(self, transfer_id: str) -> Intake:
        intake = self.intakes.get(transfer_id)
        if intake is None:
            raise InvalidRequestError(f"no transfer {transfer_id!r} was set up here")
        return intake

    def _retire(self, live: _Live, intake: Intake) -> None:
        """The KV is in (or withdrawn): the reservation's lease is over."""
        live.intake = None
        self.intakes.pop(intake.transfer_id, None)
        intake.lease.end()

    def _piece_done(self, intake: Intake, seq: int, task: asyncio.Task) -> None:
        if task.cancelled() or self.intakes.get(intake.transfer_id) is not intake:
            return
        if task.exception() is None:
            if self.verifies:  # summed as landed, off the loop, while later pieces arrive
                intake.sums[seq] = asyncio.ensure_future(
                    blocks_checksum_off_loop(self.engine.engine.kv.data, intake.landed_pages(seq)))
            return
        self.live.fail(self.live[intake.request_id], task.exception())

    def _drop_intake(self, live: _Live) -> Unsafe:
        """Withdraw the request's transfer; what a receive may still write comes back as Unsafe."""
        intake = live.intake
        if intake is None:
            return Unsafe()
        self._retire(live, intake)
        assert self.receiver is not None
        cancelled = self.receiver.cancel(intake.transfer_id)
        for task in intake.pieces.values():
            task.cancel()
        return Unsafe.of([cancelled, *intake.failures()])

    def _quarantine(self, request_id: str, aborted: asyncio.Future, unsafe: Unsafe) -> None:
        if aborted.cancelled() or aborted.exception() is not None or aborted.result() is None:
            return
        hold: BlockHold = aborted.result()
        log.error("request %s: blocks %s may still be written by a withdrawn receive; quarantined for at most "
                  "%.0f s", request_id, hold.blocks, self.quarantine_timeout_s)
        lease = self.leases.grant(LeaseKind.QUARANTINE, f"withdrawn receives of {request_id}", len(hold.blocks),
                                  self.quarantine_timeout_s, lambda reason: self.engine.release_nowait(hold))
        if unsafe.settled is not None:
            unsafe.settled.add_done_callback(lambda _: lease.end(Reclaim.SETTLED))

    # ---- engine steps -> sessions ----

    def on_step(self, result: StepResult) -> None:
        for reservation in result.reserved:
            self._on_reserved(reservation.request, reservation.block_ids, reservation.cached_blocks)
        for preemption in result.preemptions:
            self._notify(preemption.request, Preempted(preemption.mode.value, preemption.reason, "preempted"))
        for request in result.resumed:
            self._notify(request, Preempted("", "", "resumed"))
        for out in result.outputs:
            self._on_output(out)
        if self.releases_holds:
            for hold in result.holds.values():  # nothing of a decode worker's is sent on
                self.engine.release_nowait(hold)

    def _on_reserved(self, request: Request, block_ids: tuple[int, ...], cached_blocks: int) -> None:
        live = self.live.owner(request)
        if live is None:
            return
        transfer_id = f"{request.request_id}#{next(self._transfer_ids)}"
        lease = self.leases.grant(LeaseKind.RESERVATION, f"Decode stream of {request.request_id}", len(block_ids),
                                  None, lambda reason: self._reservation_ended(live, reason))
        intake = Intake(transfer_id, request.request_id, block_ids, live.job.kv_timeout_s, lease,
                        secrets.token_bytes(SECRET_BYTES),
                        cached_blocks=cached_blocks * self.engine.engine.kv.groups.count)  # table entries
        live.intake = intake
        self.intakes[transfer_id] = intake
        live.session.push(Reserved(transfer_id, block_ids, intake.secret, cached_blocks))

    def _reservation_ended(self, live: _Live, reason: Reclaim) -> None:
        """KV must keep arriving: at most kv_timeout between pieces and until CompleteKV. Before
        the first piece the router guards the request (it cancels this stream if prefill fails)."""
        if reason is Reclaim.EXPIRED:
            self.live.fail(live, TimeoutError(f"KV for {live.job.request_id} did not arrive in time"))

    def _on_output(self, out: RequestOutput) -> None:
        live = self.live.owner(out.request)
        if live is None:
            return
        if out.new_token_ids:
            live.progress.tokens.extend(out.new_token_ids)
            live.session.push(Tokens(out.new_token_ids, out.logprobs, out.prompt_logprobs))
        if out.finished:
            r = out.request
            queue_s = max(0.0, (r.first_scheduled_time or r.arrival_time) - r.arrival_time)
            live.progress.finished = Finished(r.finish_reason, r.num_cached_tokens, r.num_preemptions, queue_s)
            live.session.push(live.progress.finished)
            self.orphans.finished(live)

    def _notify(self, request: Request, notice: Preempted) -> None:
        live = self.live.owner(request)
        if live is not None:
            live.session.push(notice)


def _check_job(job: DecodeJob) -> None:
    """What the engine does not check itself (it validates prompt, sampling and resumed tokens)."""
    check_id("request_id", job.request_id)
    check_timeout("kv_timeout_s", job.kv_timeout_s)


def _add(engine: Engine, job: DecodeJob) -> Request:
    """On the engine thread: a local prefill or a remote one, a resume's tokens so far included
    in either (prefilled here, or their KV sent by the prefill worker with the prompt's)."""
    add = engine.add_request if job.local_prefill else engine.add_remote_request
    return add(job.request_id, job.prompt, job.sampling, job.priority, job.output_token_ids, job.age_s)


def _abort(engine: Engine, request_id: str, unsafe: tuple[int, ...]) -> BlockHold | None:
    """Abort and give back the blocks of a withdrawn transfer at once, except those a late write
    could still land in: they come back as one quarantine hold."""
    quarantined = None
    for hold in engine.abort(request_id).holds:
        if unsafe and hold.request_id == request_id and quarantined is None:
            quarantined = engine.scheduler.quarantine(hold, unsafe)
        else:
            engine.release(hold)
    return quarantined
