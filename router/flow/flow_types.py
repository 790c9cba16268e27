"""The values of one request's flow through the workers (router/flow/flow.py drives it): the job as the
gateway hands it over, the events the flow yields (tokens, the end, milestones for the trace), the
state one request keeps across its attempts, one attempt's pieces and its jobs on the workers, and
the flow's settings."""

from __future__ import annotations

import dataclasses
import enum
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdserve.aborts import Owner
from pdserve.admission import AdmissionPolicy
from pdserve.config import DeadlineConfig
from pdserve.reattach import HeldAttempt
from pdserve.requests import FinishReason, Priority, SamplingParams, TokenLogprobs
from router.doors.asks import Resume
from router.fleet.clients import WorkerFault, WorkerJob
from router.fleet.workers import Worker
from router.flow.protocol import RequestProtocol
from router.flow.recovery import RecoveryPolicy
from router.flow.stream import Pumped
from router.placement.local_prefill import LocalPrefillPolicy


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    priority: Priority
    metadata: tuple[tuple[str, str], ...] = ()
    deadline: float | None = None  # time.monotonic() at which the client stops waiting
    tenant: str = "anonymous"
    accepted: float = field(default_factory=time.monotonic)  # when the router took it (time.monotonic())
    pin: tuple[str, str] | None = None  # (prefill, decode): a canary runs on this pair alone, once
    # A sample of n (router/flow/samples.py) after the first: its first attempt runs on this decode
    # worker, which prefills it from its prefix cache (the first sample's KV); a retry is placed anew.
    beside: str | None = None
    client_id: str = ""  # the client's request id when request_id is not it (a sample's job)
    resume: Resume | None = None  # a stream continued at this router (pdserve/reattach.py)

    @property
    def reattachable(self) -> bool:
        """Its attempts may outlive this router for another to attach: a client's one request (not
        a canary, nor a sample of n), whose every token the worker can give again (no log-probabilities)."""
        return (not self.pinned and not self.client_id and self.sampling.logprobs is None
                and self.sampling.prompt_logprobs is None)

    @property
    def owner(self) -> Owner:
        """The client's request this job serves: what an Abort names."""
        return Owner(self.tenant, self.client_id or self.request_id)

    @property
    def pinned(self) -> bool:
        return self.pin is not None

    def age_s(self) -> float:
        """How long ago the router accepted it: a retry or resume keeps its place in workers' queues."""
        return max(0.0, time.monotonic() - self.accepted)

    def timeout_s(self) -> float | None:
        """What is left of the client's deadline, for the calls made on its behalf."""
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())


@dataclass(frozen=True)
class Resumed:
    """(A continued stream's first event.) The tokens the client has already: never sent again;
    the text goes on after them."""

    prior: tuple[int, ...]


@dataclass(frozen=True)
class NewTokens:
    """Tokens for the client, each exactly once across retries and resumes. `logprobs`: one per
    token id, in order, when the request set sampling.logprobs (else empty); each computed by
    the worker that sampled the token and never sent again. `prompt_logprobs`: with the first
    token, when the request set sampling.prompt_logprobs. `arrived`: (time.perf_counter(), tokens)
    per worker step, for steps gathered before the flow took them (router/flow/stream.py), read
    as it comes (the trace's timeline); empty: they came as one, now."""

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...] = ()
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    arrived: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class Done:
    reason: FinishReason
    cached_tokens: int
    preemptions: int
    preemptions_by_mode: dict = field(default_factory=dict)  # "recompute" | "swap" -> count
    kv_bytes: int = 0  # KV moved from prefill to decode workers, over every attempt
    decode_cached_tokens: int = 0  # prompt tokens the (last) decode worker held already
    local_prefill: bool = False  # the (last) decode worker prefilled the prompt itself


@dataclass(frozen=True)
class Milestone:
    """Something for the trace: placement, prefill chunk, KV transfer, preemption, retry."""

    name: str
    attributes: dict


FlowEvent = NewTokens | Done | Milestone | Resumed
Outlet = Callable[[FlowEvent], None]  # a flow's consumer, taking an event as the flow would yield it


@dataclass
class FlowState:
    protocol: RequestProtocol
    generated: list[int] = field(default_factory=list)
    faults: list[WorkerFault] = field(default_factory=list)
    cached_tokens: int = 0
    preemptions: int = 0
    by_mode: dict[str, int] = field(default_factory=dict)
    # role -> the workers this request failed on, each with its incarnation then (router/fleet/workers.py)
    avoid: dict[str, dict[str, int]] = field(default_factory=lambda: {"prefill": {}, "decode": {}})
    kv_bytes: int = 0
    decode_cached_tokens: int = 0
    local_prefill: bool = False
    move_to: str | None = None  # the decode worker a move chose for the next placement
    departed: tuple[str, str] | None = None  # (decode worker, the attempt's id there) holding its KV for a move
    attach: HeldAttempt | None = None  # a continued stream's attempt a decode worker holds: the next attempt attaches it
    attachment: int = 0  # this router's anchor of the attempt decoding now (its Attached's; 0: its Decode call)
    outlet: Outlet | None = None  # where its relayed tokens may go as they come (router/flow/decoding.py)
    claim: Worker | None = None  # the decode worker it chose, until its call there opens (Placer.claim)

    def avoided(self, role: str, workers: Sequence[Worker]) -> set[str]:
        """The workers of `role` to avoid: those this request failed on, unless they restarted since."""
        now = {w.address: w.incarnation for w in workers}
        return {a for a, incarnation in self.avoid[role].items() if now.get(a, incarnation) == incarnation}

    def done(self, reason: FinishReason, cached: int = 0) -> Done:
        return Done(reason, self.cached_tokens or cached, self.preemptions, dict(self.by_mode), self.kv_bytes,
                    self.decode_cached_tokens, self.local_prefill)


@dataclass(frozen=True)
class Attempt:
    """One attempt of a request once its decode call is open: what each of its phases reads
    (router/flow/reserving.py, prefilling.py, decoding.py)."""

    job: Job
    state: FlowState
    decode: Worker  # its decode worker
    call: Pumped  # the decode call there, read in the background from its open
    worker_id: str  # the attempt's id on its decode worker
    opened: float  # time.monotonic() at which the decode call was opened


Blame = Callable[[FlowState, WorkerFault, str, str], None]  # (state, fault, role, address): charge and avoid


def worker_job(job: Job, state: FlowState, config: FlowConfig, moving_kv: bool = False) -> WorkerJob:
    """Each call of an attempt has its own id on the workers, so it never meets an earlier attempt,
    nor an earlier request of the client with the same id still ending there. `moving_kv`: the KV
    comes from the decode worker it departed from, of every token but the last, which the new
    worker feeds first (as a prefill's first token)."""
    worker_id = f"{job.request_id}@{state.protocol.attempts}.{secrets.token_hex(4)}"
    out = tuple(state.generated[:-1] if moving_kv else state.generated)
    sampling = dataclasses.replace(job.sampling, prompt_logprobs=None) if out else job.sampling  # sent once
    return WorkerJob(worker_id, job.prompt, sampling, job.priority, config.kv_timeout_s,
                     out, job.metadata, job.timeout_s(), job.age_s(),
                     None if job.pinned else job.owner,  # a canary: no client may abort it
                     job.reattachable and config.reattach)


MOVED_KV = "moved_kv"  # a placement's reason when no prompt is computed: the KV moves from the departed worker
ATTACHED = "attached"  # ... or: a continued stream's request, attached where it decodes (router/flow/reattaching.py)


class ReserveAt(enum.Enum):
    """When a remote prefill's decode blocks are reserved."""

    PREFILL = "prefill"  # once a prefill worker has started the prompt; its KV waits there until then (the default)
    ARRIVAL = "arrival"  # when the request is placed, before it queues for a prefill worker


class OnLeave(enum.Enum):
    """What a request decoding on a worker that leaves (draining, changing role) does, when another
    decode worker could take it now."""

    MOVE_KV = "move"  # its KV moves there over the transfer layer; decoding goes on (the default)
    PREFILL = "prefill"  # it is prefilled again (prompt and tokens so far) by the prefill pool
    FINISH = "finish"  # it finishes where it is, within the worker's drain timeout


@dataclass(frozen=True)
class FlowConfig:
    colocated: bool = False
    kv_timeout_s: float = DeadlineConfig().kv_timeout_s
    # A request waits this long (within its deadline) for a usable worker, then UNAVAILABLE: long enough
    # for a stalled worker to be seen and its peer taken, short enough for a client to go elsewhere.
    wait_for_worker_s: float = 5.0
    no_worker_retry_after_s: float = 1.0  # ... its retry hint (a worker back, or another router)
    resume_wait_s: float = 30.0  # ... and this long for a request whose tokens are out (a resume)
    probe_timeout_s: float = 1.0  # MatchPrefix probes of prefill and decode workers
    recovery: RecoveryPolicy = RecoveryPolicy()
    local_prefill: LocalPrefillPolicy = LocalPrefillPolicy()
    admission: AdmissionPolicy = AdmissionPolicy()  # objectives per class; none: every request admitted
    # A request queued this long for its reservation moves to a decode worker that has room now
    # (nothing waiting there, free blocks for it), at most max_moves times; checked every move_check_s.
    move_after_s: float = 2.0
    move_check_s: float = 0.5
    max_moves: int = 2
    on_leave: OnLeave = OnLeave.MOVE_KV
    # A decoding request's token events wait in its call until this many tokens came (0: its task
    # wakes at each): the stream interval's N, sooner than which nothing is sent (its first tokens at once).
    gather_tokens: int = 0
    # Reserved when the prefill starts (PREFILL), a prompt queued behind others on the prefill
    # workers holds no decode blocks, which the running streams grow into (a prefill worker that
    # does not take a late reservation is given one at arrival); docs/BENCHMARKS.md,
    # "Reservations when the prefill starts", has the 60-chat scenario both ways.
    reserve_at: ReserveAt = ReserveAt.PREFILL
    # A request decoding where requests wait for blocks moves, KV and all, to a decode worker with
    # room: at most one per worker per this many seconds (router/placement/rebalancing.py); None: never.
    rebalance_interval_s: float | None = 1.0
    # A client's stream may outlive this router: its decode attempts end on purpose only by an
    # Abort, so a decode worker keeps one whose call broke for another router to attach (pdserve/reattach.py).
    reattach: bool = True
