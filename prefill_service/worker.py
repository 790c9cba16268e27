"""The prefill worker beneath its servicer: chunked prefill, KV streamed as chunks complete.

    router --Prefill(request, reservation)--> open()      engine: add (max_tokens 1, holds on)
    every step: on_step() -> new complete blocks of each request -> a piece:
        decode.PushKV(piece descriptors)  then  sender.send(blocks)     (overlaps the next step)
    last chunk samples the first token -> last piece -> decode.CompleteKV(first token)
           <-- Chunk ... FirstToken --

A prefill opened without its reservation (`target` None: the router reserves decode blocks once
this worker has started the prompt) keeps what its steps computed, held, until `set_target`
brings the reservation; then what was held goes out as one piece and the steps go on as above.
While a queued request of a higher class lacks the blocks such prompts hold, some of them give
their KV back (prefill_service/giving_back.py; whom: pdserve/scheduler/held.py): the prompt
leaves the engine and is added again at `set_target`, computed anew (from the prefix cache as
far as it still holds it) and sent as it is.

The engine holds every block of a request that a piece still has to read (BlockHold) until
the send finished, so preemption or eviction can never recycle blocks under a transfer. Each
hold is a lease owned by its piece's send: it ends when the send ends (or never starts), or
when the send outlives the piece's kv timeout.

At tensor parallel size p every rank sends its own heads' share of each piece to each decode
rank holding some of them (pdserve/parallel/kv_ranks.py); the reservation lists the decode
ranks (none listed: one rank with every head).

A failure towards the decode worker (its RPCs, the KV send to it, a lease expiry) ends the
stream with PeerFault: the decode worker, not this one, is charged for it. A lost rank of this
worker (RankFailed) is this worker's fault.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pdserve.aborts import Owner
from pdserve.engine.async_engine import AsyncEngine
from pdserve.engine.engine import Engine
from pdserve.errors import IncompatibleError, InvalidRequestError, PeerFault
from pdserve.engine.outputs import StepResult
from pdserve.kv import BlockHold
from pdserve.parallel.kv_ranks import RanksSender
from pdserve.requests import Priority, SamplingParams
from pdserve.rpc.bounds import check_id, check_timeout
from pdserve.rpc.errors import NotFound
from pdserve.scheduler.held import HeldVictims, LowerClassLatest
from pdserve.scheduler.output import ScheduledChunk
from pdserve.transfer import KVSender
from pdserve.validation import validate_resumed
from pdserve.worker.events import Chunk, FirstToken
from pdserve.worker.kv_out import DecodePeer, Piece, Target, check_target, send_piece
from pdserve.worker.kv_sums import KVSums
from pdserve.worker.leases import Lease, LeaseKind, Leases, Reclaim
from pdserve.worker.live import LiveRequests
from pdserve.worker.session import Session
from prefill_service.giving_back import GivingBack
from prefill_service.jobs import Computed, PrefillJob, Waiting

log = logging.getLogger(__name__)


class PrefillWorker:
    def __init__(self, engine: AsyncEngine, sender: KVSender | RanksSender, peer: DecodePeer, block_size: int,
                 block_nbytes: int, leases: Leases, sums: KVSums | None = None,
                 held_victims: HeldVictims | None = None):
        """`sender`: every rank's (a plain KVSender: this worker has one rank). `sums`: how it sums
        the pieces it sends (None: it sends no checksums). `held_victims`: which prompts waiting
        for their target give their KV back to a queued request of a higher class (default
        LowerClassLatest)."""
        self.engine = engine
        self.sender = sender if isinstance(sender, RanksSender) else RanksSender.alone(
            sender, engine.engine.kv.shape.num_kv_heads)
        self.peer = peer
        self.block_size = block_size
        self.block_nbytes = block_nbytes
        self.groups = engine.engine.kv.groups.count  # table entries per block (layer groups)
        self.live: LiveRequests[PrefillJob] = LiveRequests(engine, self._end)
        self.leases = leases
        self.sums = sums
        self.giving_back = GivingBack(engine, held_victims or LowerClassLatest(), self.live.records, self._give_back)
        engine.add_listener(self.on_step)

    async def open(self, request_id: str, prompt: tuple[int, ...], sampling: SamplingParams, priority: Priority,
                   target: Target | None, kv_timeout_s: float, resumed: tuple[int, ...] = (), age_s: float = 0.0,
                   owner: Owner | None = None) -> Session:
        """The prompt's KV (and a resume's: of the tokens generated so far, `resumed`, too) sent
        into `target` (None: it follows, by set_target), then the next token; queued as if it had
        arrived `age_s` ago; `owner`: its client's request (an Abort of it through any router ends it).
        InvalidRequestError, with nothing started, for a bad id, timeout or reservation (the
        engine checks prompt, sampling, `resumed` and `age_s` itself)."""
        check_id("request_id", request_id)
        check_timeout("kv_timeout_s", kv_timeout_s)
        validate_resumed(resumed, sampling, self.engine.engine.limits)  # the engine sees max_tokens len(resumed) + 1
        kv_tokens = len(prompt) + len(resumed)
        if target is not None:
            check_target(target, self.sender, self.block_size, self.block_nbytes, kv_tokens, self.groups)
        job = PrefillJob(request_id, kv_tokens, target, Session(request_id, owner), kv_timeout_s,
                         sent_blocks=target.cached_blocks * self.groups if target else 0, resumed=len(resumed),
                         priority=priority)
        # the first token only; min_tokens capped with it (what bans an end for that one token stays)
        first_only = SamplingParams(**{**sampling.__dict__, "max_tokens": len(resumed) + 1, "stop": (),
                                       "min_tokens": min(sampling.min_tokens, len(resumed) + 1)})
        opened = time.monotonic()  # (added again after a give-back: as old as it is then; the engine checks age_s)
        job.add = lambda e: e.add_request(request_id, prompt, first_only, priority, resumed,
                                          age_s + (time.monotonic() - opened), sends_kv=True)
        session = await self.live.open(job, job.add)
        self.giving_back.soon()
        return session

    def _end(self, job: PrefillJob, abort: bool) -> None:
        """The request ended here (LiveRequests' end hook): stop its sends and, if asked, abort
        it in the engine (queued at once: nothing can cancel it)."""
        job.failed = True
        for task in job.tasks:
            task.cancel()
        if job.waiting is not None and job.waiting.lease is not None:
            job.waiting.lease.end()
        if abort:
            self.engine.call_nowait(lambda e: _abort(e, job.request_id))

    # ---- engine steps -> pieces ----

    def on_step(self, result: StepResult) -> None:
        unclaimed = dict(result.holds)
        logprobs = {out.request: out.logprobs[0] for out in result.outputs if out.logprobs}
        prompt = {out.request: out.prompt_logprobs for out in result.outputs if out.prompt_logprobs}
        for chunk in result.chunks:
            job = self.live.owner(chunk.request)
            if job is not None:
                job.first_logprobs = logprobs.get(chunk.request, job.first_logprobs)
                job.prompt_logprobs = prompt.get(chunk.request, job.prompt_logprobs)
                self._on_chunk(job, chunk, unclaimed.pop(chunk.request.request_id, None), result.seconds)
        for hold in unclaimed.values():  # requests that ended without a piece to send
            self.engine.release_nowait(hold)
        self.giving_back.soon()

    def _on_chunk(self, job: PrefillJob, chunk: ScheduledChunk, hold: BlockHold | None, step_s: float) -> None:
        request = chunk.request
        job.cached_tokens = request.num_cached_tokens
        if not job.started:
            job.started = True
            job.queue_seconds = max(0.0, (request.first_scheduled_time or request.arrival_time) - request.arrival_time)
        job.session.push(Chunk(chunk.start, chunk.num_tokens, request.num_cached_tokens, step_s))
        final = chunk.samples
        first = request.output_token_ids[job.resumed] if final and len(request.output_token_ids) > job.resumed else None
        computed = Computed(tuple(hold.blocks if hold is not None else chunk.block_table), chunk.end, final, first)
        if job.target is None:
            self._wait(job, computed, hold)
        else:
            self._ship(job, computed, hold)

    def _ship(self, job: PrefillJob, computed: Computed, hold: BlockHold | None) -> None:
        """The blocks `computed` completed since the last piece go out as the next piece, after it."""
        complete = (-(-job.kv_tokens // self.block_size) if computed.final else computed.end // self.block_size) \
            * self.groups  # table entries, `groups` a block
        piece = None
        if complete > job.sent_blocks:
            piece = Piece(job.target.transfer_id, job.seq, job.sent_blocks,
                          computed.blocks[job.sent_blocks:complete], job.kv_timeout_s, job.target.secret,
                          len(self.sender.ports))
            job.seq += 1
            job.sent_blocks = complete
        self._chain(job, piece, hold, computed.first_token)

    # ---- a target that follows ----

    def _wait(self, job: PrefillJob, computed: Computed, hold: BlockHold | None) -> None:
        """Keep this step's hold until the target comes; the previous one's blocks are in it."""
        previous = job.waiting
        waiting = job.waiting = Waiting(computed, hold) if previous is None else \
            Waiting(computed, hold, held_at=previous.held_at)
        if hold is not None:
            def reclaim(_: Reclaim) -> None:
                if not waiting.handed_on:
                    self.engine.release_nowait(hold)

            waiting.lease = self.leases.grant(LeaseKind.WAITING, f"KV of {job.request_id} waiting for its target",
                                              len(hold.blocks), None, reclaim)
        if previous is not None and previous.lease is not None:
            previous.lease.end()

    def set_target(self, request_id: str, target: Target) -> int:
        """The reservation of a prefill opened without one: what it computed so far goes out now
        (its table entries, returned). NotFound: no such prefill here; IncompatibleError: it has
        one; InvalidRequestError: one this worker cannot fill (the prefill fails with it)."""
        job = self.live.get(check_id("request_id", request_id))
        if job is None:
            raise NotFound(f"no prefill {request_id!r} is running here")
        if job.target is not None:
            raise IncompatibleError(f"prefill {request_id!r} has its reservation already")
        try:
            check_target(target, self.sender, self.block_size, self.block_nbytes, job.kv_tokens, self.groups)
        except InvalidRequestError as exc:
            self._fail(job, exc)
            raise
        job.target, job.sent_blocks = target, target.cached_blocks * self.groups
        if job.given_back:
            self._add_again(job)
            return 0
        waiting, job.waiting = job.waiting, None
        if waiting is None:
            return 0
        waiting.handed_on = True  # to the piece's own lease, granted by _ship
        self._ship(job, waiting.computed, waiting.hold)
        if waiting.lease is not None:
            waiting.lease.end()
        return job.sent_blocks - target.cached_blocks * self.groups

    # ---- held KV given back to a higher class ----

    def _give_back(self, job: PrefillJob) -> None:
        """Its held KV goes back now (and the rest of it out of the engine, if it was still
        prefilling); it is added again at set_target. Its steps in flight never reach it."""
        waiting, job.waiting = job.waiting, None
        job.given_back, job.request = True, None
        self.engine.call_nowait(lambda e: _abort(e, job.request_id))
        if waiting is not None and waiting.lease is not None:
            waiting.lease.end()  # releases the hold

    def _add_again(self, job: PrefillJob) -> None:
        """A given-back prompt into the engine again, now that its target came (queued there as
        old as the request); a refusal fails it."""
        job.given_back = False
        loop = asyncio.get_running_loop()

        def bind(engine: Engine) -> None:
            try:
                job.request = job.add(engine)
            except Exception as exc:  # (full queue, the engine's checks): the stream says why
                loop.call_soon_threadsafe(self._fail, job, exc)

        self.engine.call_nowait(bind)

    def _chain(self, job: PrefillJob, piece: Piece | None, hold: BlockHold | None, first_token: int | None) -> None:
        """Pieces of one request go out in order; other requests' pieces proceed in parallel.

        The hold's lease ends when the send ends, and in the task's done callback too: a task
        cancelled before it first ran (the request closed in the same loop iteration) never runs
        its body, but its callbacks always run.
        """
        previous = job.chain

        async def run() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            if piece is not None and not job.failed:
                if lease is not None:
                    lease.renew(piece.timeout_s)
                await self._send_piece(job, piece)
            if lease is not None:
                lease.end()
            if first_token is not None and not job.failed:
                await self._complete(job, first_token)

        task = asyncio.ensure_future(run())
        lease = self._hold_lease(job, piece, hold, task) if hold is not None else None  # NOTE: before run() starts
        task.add_done_callback(lambda t: self._shipped(job, t, lease))
        job.chain = task
        job.tasks.append(task)

    def _hold_lease(self, job: PrefillJob, piece: Piece | None, hold: BlockHold, task: asyncio.Task) -> Lease:
        """Owner: the piece's send; limit: the piece's kv timeout, from when its send starts (a
        piece waiting behind an earlier one is bounded by that one's lease)."""
        owner = f"send of piece {piece.seq} of {piece.transfer_id}" if piece else f"chain of {job.target.transfer_id}"

        def reclaim(reason: Reclaim) -> None:
            self.engine.release_nowait(hold)
            if reason is Reclaim.EXPIRED:
                self._fail(job, PeerFault(f"{owner}: not delivered to {job.target.decode_endpoint} "
                                          f"within {job.kv_timeout_s} s"))

        return self.leases.grant(LeaseKind.HOLD, owner, len(hold.blocks), None, reclaim)

    async def _complete(self, job: PrefillJob, first_token: int) -> None:
        await self.peer.complete_kv(job.target.decode_endpoint, job.target.transfer_id, job.seq, first_token,
                                    job.target.secret, job.checksums if self.sums is not None else ())
        job.session.push(FirstToken(first_token, job.cached_tokens, job.kv_bytes, job.sent_blocks // self.groups,
                                     job.kv_descriptors, job.kv_seconds, job.queue_seconds, job.first_logprobs,
                                     job.prompt_logprobs))

    async def _send_piece(self, job: PrefillJob, piece: Piece) -> None:
        sent = await send_piece(self.sender, self.peer, job.target, piece, self.sums)
        job.checksums.append(sent.checksum)
        job.kv_bytes += sent.nbytes
        job.kv_descriptors += sent.descriptors
        job.kv_seconds += sent.seconds

    def awaiting_target(self) -> int:
        """Started prefills whose reservation has not come (their KV waits here)."""
        return sum(1 for job in self.live.records() if job.target is None and job.started)

    def kv_rank_bytes(self) -> list[int]:
        """KV bytes each rank of this worker sent, rank 0 first."""
        return list(self.sender.rank_bytes)

    def _shipped(self, job: PrefillJob, task: asyncio.Task, lease: Lease | None) -> None:
        if lease is not None:
            lease.end()
        if not task.cancelled() and task.exception() is not None:
            self._fail(job, task.exception())

    def _fail(self, job: PrefillJob, error: BaseException) -> None:
        """Stop and free everything now (the stream may be slow to read), then end the stream."""
        if self.live.fail(job, error):
            log.warning("request %s failed here: %s", job.request_id, error)


def _abort(engine: Engine, request_id: str) -> None:
    """Abort and give back the request's blocks: its pieces' sends hold what they still read."""
    for hold in engine.abort(request_id).holds:
        engine.release(hold)
