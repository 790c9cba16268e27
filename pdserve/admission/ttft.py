"""A request's time to first token on one path, predicted from the figures the workers measure
(pdserve/engine/step_meter.py, polled in Stats) and what the router measured itself:

    reserve_s   the decode worker: until it has reserved the request's blocks (one of its steps
                when it has room and nothing waits there; else as long as its recent reservations
                took, measured by the router)
    queue_s     the worker computing the prompt: the prompt tokens it computes before this one,
                at its measured prefill speed
    prefill_s   this prompt's tokens it does not hold already, at that speed
    transfer_s  a remote prefill's last KV piece to the decode worker (the others overlap the
                next chunk), as long as the last pieces from that worker took lately; 0 locally

    total_s = reserve_s + queue_s + prefill_s + transfer_s

The steps run in that order on the service's path (docs/ARCHITECTURE.md): reserve, then
prefill behind the worker's queue, then the last piece and the first token. With the
reservation taken when the prefill starts (`overlapped`, the router's `--reserve-at prefill`),
the prompt computes while its blocks are reserved, and the first piece waits for them:

    total_s = queue_s + max(prefill_s, reserve_s) + transfer_s
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillSide:
    """A worker that would compute the prompt (a prefill worker, or the decode worker itself)."""

    address: str
    queued_tokens: int  # prompt tokens it computes before this one
    tokens_per_s: float  # its measured prefill speed (<= 0: not known)
    cached_tokens: int = 0  # of this prompt it holds already
    transfer_s: float = 0.0  # its last KV piece to a decode worker (0: it is the decode worker)


@dataclass(frozen=True)
class TtftPrediction:
    reserve_s: float
    queue_s: float
    prefill_s: float
    transfer_s: float
    prefill_worker: str  # who computes the prompt
    overlapped: bool = False  # reserved once the prefill starts: the reservation overlaps the prefill

    @property
    def total_s(self) -> float:
        if self.overlapped:
            return self.queue_s + max(self.prefill_s, self.reserve_s) + self.transfer_s
        return self.reserve_s + self.queue_s + self.prefill_s + self.transfer_s

    def attributes(self) -> dict[str, float | str]:
        """For a span or a log line."""
        return {"pdserve.ttft.predicted_s": self.total_s, "pdserve.ttft.predicted.reserve_s": self.reserve_s,
                "pdserve.ttft.predicted.queue_s": self.queue_s, "pdserve.ttft.predicted.prefill_s": self.prefill_s,
                "pdserve.ttft.predicted.transfer_s": self.transfer_s,
                "pdserve.ttft.predicted.prefill_worker": self.prefill_worker,
                "pdserve.ttft.predicted.overlapped": self.overlapped}


def predict_prefill(prompt_tokens: int, side: PrefillSide, fallback_tokens_per_s: float) -> tuple[float, float]:
    """(queue_s, prefill_s) of `prompt_tokens` on `side`; its speed, or the fallback where it has
    none. At least the prompt's last token is computed, however much of it is cached."""
    rate = side.tokens_per_s if side.tokens_per_s > 0 else fallback_tokens_per_s
    if rate <= 0:
        raise ValueError(f"no prefill speed for {side.address} (fallback {fallback_tokens_per_s})")
    uncached = max(1, prompt_tokens - side.cached_tokens)
    return max(0, side.queued_tokens) / rate, uncached / rate


def predict_ttft(prompt_tokens: int, side: PrefillSide, reserve_s: float,
                 fallback_tokens_per_s: float, overlapped: bool = False) -> TtftPrediction:
    """`overlapped`: the decode blocks are reserved once the prefill starts (a remote prefill only)."""
    queue_s, prefill_s = predict_prefill(prompt_tokens, side, fallback_tokens_per_s)
    return TtftPrediction(max(0.0, reserve_s), queue_s, prefill_s, max(0.0, side.transfer_s), side.address,
                          overlapped)
