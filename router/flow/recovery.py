"""What a worker fault leads to, for one request: retry, resume, complete, abort, or fail with a status.

Policy only: it reads the fault, what the request has produced and met so far, and decides;
`router/flow/flow.py` carries the decision out. Who is charged for a fault (the breakers) is
decided here too, by `charged_to`.

    fault                                   no token out yet        tokens out
    ------------------------------------    --------------------    ----------------------------
    ABORTED: its client's Abort, sent to    end (finish ABORT)      (same)
    another router, reached the worker
    TAKEN: another router attached it       fail ABORTED            (same): its client went there
    client's deadline passed                fail DEADLINE_EXCEEDED  (same)
    REFUSED by the worker (bad request)     fail INVALID_ARGUMENT   (same)
    every token already out                 -                       complete (LENGTH / STOP)
    GONE, TIMEOUT of the KV, OVERLOADED,    retry elsewhere         resume elsewhere (or fail)
    CORRUPT KV, INCOMPATIBLE, WITHDRAWN
    FAILED on two different workers         fail INTERNAL: the request is poison, no worker is charged
    attempts used up                        fail with the last fault's status
"""

from __future__ import annotations

import enum
import time
from collections.abc import Collection
from dataclasses import dataclass

from pdserve.errors import ClientAborted, InvalidRequestError, OverloadedError
from pdserve.requests import FinishReason, SamplingParams
from pdserve.rpc.errors import Unavailable
from router.fleet.clients import Culprit, FaultKind, WorkerFault


class Action(enum.Enum):
    RETRY = "retry"
    RESUME = "resume"
    COMPLETE = "complete"
    ABORT = "abort"  # its client aborted it: it ends as aborted (finish ABORT), no status
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    action: Action
    error: Exception | None = None  # for FAIL: what the client's stream ends with
    reason: FinishReason | None = None  # for COMPLETE and ABORT


class RequestPoisoned(RuntimeError):
    """The same request failed inside several workers (maps to INTERNAL)."""


@dataclass(frozen=True)
class RecoveryPolicy:
    max_attempts: int = 4
    resume_on_decode_failure: bool = True
    poison_after: int = 2  # distinct workers that failed internally on the same request
    eos_token_ids: tuple[int, ...] = ()

    def decide(self, fault: WorkerFault, history: Collection[WorkerFault], generated: list[int],
               sampling: SamplingParams, attempts: int, deadline: float | None) -> Decision:
        """`history` holds every fault of this request, `fault` included."""
        if fault.kind == FaultKind.ABORTED:
            return Decision(Action.ABORT, reason=FinishReason.ABORT)
        if fault.kind == FaultKind.TAKEN:
            return Decision(Action.FAIL, ClientAborted(f"the stream goes on at another router ({fault.message})"))
        if deadline is not None and time.monotonic() >= deadline:
            return Decision(Action.FAIL, TimeoutError("the request's deadline passed"))
        if fault.kind == FaultKind.REFUSED and fault.culprit == Culprit.SELF:
            return Decision(Action.FAIL, InvalidRequestError(fault.message))
        if generated and (reason := self.complete_reason(generated, sampling)) is not None:
            return Decision(Action.COMPLETE, reason=reason)
        if generated and not self.resume_on_decode_failure:
            return Decision(Action.FAIL, Unavailable(f"the decode worker serving the request failed ({fault.message})"))
        if self._poisoned(history):
            return Decision(Action.FAIL, RequestPoisoned(f"the request failed on {self.poison_after} workers; "
                                                         f"last: {fault.message}"))
        if attempts >= self.max_attempts:
            return Decision(Action.FAIL, _status_of(fault, attempts))
        return Decision(Action.RESUME if generated else Action.RETRY)

    def complete_reason(self, generated: list[int], sampling: SamplingParams) -> FinishReason | None:
        """The request is over although its Finished was lost: nothing is left to generate."""
        if len(generated) >= sampling.max_tokens:
            return FinishReason.LENGTH
        last = generated[-1]
        if last in sampling.stop_token_ids or (not sampling.ignore_eos and last in self.eos_token_ids):
            return FinishReason.STOP
        return None

    def _poisoned(self, history: Collection[WorkerFault]) -> bool:
        failed = {f.address for f in history if f.kind == FaultKind.FAILED and f.culprit == Culprit.SELF}
        return len(failed) >= self.poison_after


def charged_to(fault: WorkerFault) -> str | None:
    """The worker whose breaker counts this fault: a worker found gone, or one whose KV landed
    corrupt. An internal error belongs to one request, a refusal to the request, a deadline to
    the client."""
    if fault.kind not in (FaultKind.GONE, FaultKind.CORRUPT) or fault.culprit != Culprit.SELF:
        return None
    return fault.address


def _status_of(fault: WorkerFault, attempts: int) -> Exception:
    text = f"the request failed after {attempts} attempts; last: {fault.message}"
    if fault.kind == FaultKind.OVERLOADED:
        return OverloadedError(text)
    if fault.kind == FaultKind.TIMEOUT:
        return TimeoutError(text)
    if fault.kind == FaultKind.FAILED:
        return RequestPoisoned(text)
    return Unavailable(text)
