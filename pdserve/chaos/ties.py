"""Telling a floating-point near-tie from a real difference between two runs of one request.

A row's logits depend on the batch it ran in at the 1e-5 level, so two faithful runs of a request
can part where the choice is nearly tied. At a request's first differing index k, the judge takes
the reference distribution after prompt + the common prefix and asks whether each run's token is
what the reference itself would pick under a perturbation of at most epsilon:

    greedy   margin = max(l_top - l_a, l_top - l_b)          raw logits; l_top the largest
             (when a and b are the reference's top two: their logit gap)
    seeded   x = u * T, u = seeded_uniform(seed, k), T the CDF's total (the sampler's float64 CDF
             in vocabulary order, after the request's filters); token i is picked for x in
             [cdf[i-1], cdf[i]):

                 cdf[a-1]      cdf[a]   (mass between)   cdf[b-1]      cdf[b]
                    |---- a ------|-----------------------|----- b -------|
                                ^ x
             margin = max(distance from x to a's interval, to b's) / T
             (when a and b are neighbours and x lies in one: x's distance to their boundary;
             the mass between them is at most twice the margin)

    tie      margin <= epsilon (a token the filters removed is never a tie)
    real     otherwise: a resumed request drawing with the wrong index, a lost or doubled token

Epsilon, measured (`python -m pdserve.chaos.batch_effects --threads 1` and `--threads 2`, the
embedded model, fp32 CPU, 24 prompts of 30-90 words each alone vs all together, seeded,
temperature 0.8, 20 tokens; the larger of the two figures): the top-two logit gap moved by at
most 3.8e-5, any of the 20 most likely raw logprobs by at most 4.5e-5 (any logprob at all by
8.9e-5, in the far tail), and a CDF boundary by at most 6.8e-6 of the mass; at one thread 1 of
the 24 requests parted (at token 17, neighbouring tokens, 7.7e-9 of the mass from their boundary).
Epsilon 1e-4 (TieSpec) is about 2.6x the largest gap change and above twice the largest top-20
logprob change (a gap moves by at most the sum of two), and about 15x the largest boundary shift.
A wrong-index draw or a lost token lands a margin of order the tokens' own probabilities away
(0.39 of the mass for that request drawing with its index shifted by one), far above it.

NOTE: these are fp32 CPU figures, as the chaos fleet runs; workers in bfloat16 on a GPU would move
logits by far more than epsilon, and would need both a measured epsilon and a reference on their
device.
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdserve.bench.workloads import BenchRequest, Workload
from pdserve.chaos.analysis import Difference
from pdserve.chaos.config import TieSpec
from pdserve.requests import SamplingParams

if TYPE_CHECKING:
    import torch


class Call(enum.Enum):
    TIE = "tie"
    REAL = "real"


class Rule(enum.Enum):
    GREEDY = "greedy: logit gap"
    SEEDED = "seeded: distance to a CDF boundary"
    UNSEEDED = "unseeded draw, not replayable: real"
    LENGTH = "one output ends where the other goes on: real"
    STRICT = "strict: every difference is real"


@dataclass(frozen=True)
class Judgement:
    """`margin` in the rule's units (see the module docstring); `margin`, `epsilon` and
    `reference_token` (what the reference itself picks at the index) are None where the rule
    measured nothing (strict, unseeded, length)."""

    difference: Difference
    call: Call
    rule: Rule
    margin: float | None = None
    epsilon: float | None = None
    reference_token: int | None = None

    @property
    def tie(self) -> bool:
        return self.call is Call.TIE


def greedy_margin(logits: torch.Tensor, a: int, b: int) -> float:
    """logits: [V] -> how far the weaker of a and b is below the largest logit."""
    top = logits.max().item()
    return max(top - logits[a].item(), top - logits[b].item())


def _distance(x: float, low: float, high: float) -> float:
    return max(low - x, x - high, 0.0)


def seeded_margin(cdf: torch.Tensor, u: float, a: int, b: int) -> float:
    """cdf: [V] float64, the sampler's (cumulative filtered probabilities in vocabulary order);
    u: the draw's uniform. Infinite when the filters removed a or b."""
    total = cdf[-1].item()
    x = u * total

    def interval(i: int) -> tuple[float, float]:
        return (cdf[i - 1].item() if i else 0.0), cdf[i].item()

    (a_low, a_high), (b_low, b_high) = interval(a), interval(b)
    if a_low == a_high or b_low == b_high:
        return math.inf
    return max(_distance(x, a_low, a_high), _distance(x, b_low, b_high)) / total


def reference_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """logits: [V] raw -> [V] float32, what the sampler draws from (after its filters)."""
    from pdserve.sampling.filters import SamplingTensors, filtered_probs

    return filtered_probs(logits[None].float(), SamplingTensors.from_params([sampling], logits.device))[0]


def drawn(probs: torch.Tensor, u: float) -> int:
    """probs: [V] -> the token the sampler's inverse CDF picks for uniform u."""
    import torch

    from pdserve.sampling.sampler import inverse_cdf

    return int(inverse_cdf(probs[None], torch.tensor([u], dtype=torch.float64))[0])


def call(margin: float, epsilon: float) -> Call:
    return Call.TIE if margin <= epsilon else Call.REAL


def sampling_of(request: BenchRequest) -> SamplingParams:
    """The settings the chaos load sends (pdserve.bench.runner): no top-k, top-p or min-p."""
    return SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature, seed=request.seed,
                          ignore_eos=True)


class TieJudge(abc.ABC):
    @abc.abstractmethod
    def judge(self, request: BenchRequest, difference: Difference) -> Judgement:
        """The call on one request whose two runs differ; raises nothing for a well-formed one."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the report: which judge, with what epsilon."""

    def close(self) -> None:
        """Frees what judging took (a loaded model); the judge is not used after."""


DETERMINISTIC = "deterministic workers: exact equality, no tie judge"


class StrictJudge(TieJudge):
    """Every difference is real: for fleets whose model this process cannot load, and for
    deterministic fleets (whose outputs must equal the no-fault run's exactly)."""

    def __init__(self, why: str = "asked for"):
        self.why = why

    def judge(self, request: BenchRequest, difference: Difference) -> Judgement:
        return Judgement(difference, Call.REAL, Rule.STRICT)

    def describe(self) -> str:
        return f"strict, every difference real ({self.why})"


class ReferenceJudge(TieJudge):
    """Against the fleet's own model in this process, loaded on the first difference judged.

    `load` returns the reference (pdserve.chaos.reference.Reference or a test's stand-in with
    `encode(prompt) -> ids`, `logits(prompt_ids, prefix) -> [V]` and `close()`)."""

    def __init__(self, load: Callable[[], object], epsilon: float = TieSpec.tie_epsilon, model: str = "the embedded model"):
        self.load, self.epsilon, self.model = load, epsilon, model
        self._reference = None

    @property
    def reference(self):
        if self._reference is None:
            self._reference = self.load()
        return self._reference

    def judge(self, request: BenchRequest, difference: Difference) -> Judgement:
        sampling = sampling_of(request)
        if difference.tokens is None:
            return Judgement(difference, Call.REAL, Rule.LENGTH)
        if not sampling.greedy and sampling.seed is None:
            return Judgement(difference, Call.REAL, Rule.UNSEEDED)
        logits = self.reference.logits(self.reference.encode(request.prompt), difference.prefix)  # [V]
        a, b = difference.tokens
        if sampling.greedy:
            return self._judged(difference, Rule.GREEDY, greedy_margin(logits, a, b), int(logits.argmax()))
        from pdserve.sampling.uniforms import seeded_uniform

        u = seeded_uniform(sampling.seed, difference.first_index)
        probs = reference_probs(logits, sampling)  # [V]
        margin = seeded_margin(probs.double().cumsum(dim=-1), u, a, b)
        return self._judged(difference, Rule.SEEDED, margin, drawn(probs, u))

    def _judged(self, difference: Difference, rule: Rule, margin: float, picked: int) -> Judgement:
        return Judgement(difference, call(margin, self.epsilon), rule, margin, self.epsilon, picked)

    def describe(self) -> str:
        return f"reference, {self.model} in this process, epsilon {self.epsilon:g}"

    def close(self) -> None:
        if self._reference is not None:
            self._reference.close()
            self._reference = None


def choose(spec: TieSpec, model: str | None = None, deterministic: bool = False) -> TieJudge:
    """The reference judge when this process can load the fleet's model (`model` as the workers'
    --model; None: the embedded one, which the chaos fleet runs), else the strict one; the strict
    one always for a deterministic fleet, whose every output must equal the no-fault run's."""
    if deterministic:
        return StrictJudge(DETERMINISTIC)
    if spec.tie_judge == "strict":
        return StrictJudge()
    if spec.tie_judge != "reference":
        raise ValueError(f"unknown tie judge {spec.tie_judge!r}; one of reference, strict")
    from pdserve.checkpoint.errors import ModelLoadError
    from pdserve.checkpoint.source import resolve_model_path

    try:
        source = resolve_model_path(model)
    except ModelLoadError as exc:
        return StrictJudge(f"the fleet's model cannot be loaded here: {exc}")
    from pdserve.chaos.reference import Reference, ReferenceSpec

    return ReferenceJudge(lambda: Reference(ReferenceSpec(model)), spec.tie_epsilon, source.name)


def judge_all(judge: TieJudge, workload: Workload, differences: Sequence[Difference]) -> tuple[Judgement, ...]:
    """One judgement per difference, in order; the judge is closed after."""
    by_index = {r.index: r for r in workload.requests}
    try:
        return tuple(judge.judge(by_index[d.index], d) for d in differences)
    finally:
        judge.close()
