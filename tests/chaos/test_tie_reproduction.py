"""A batch effect reproduced in process on the embedded model is judged a tie; the same request
drawing with its seeded index shifted by one (a resumption bug) is judged real; the chaos verdict
on the pair passes and reports the tie.

24 seeded requests (prompts of 30-90 random words, temperature 0.8, 20 tokens), each alone and
all together, with one torch thread so the numerics are the same from run to run: request 11
parts at token 17 (a draw within 1e-7 of the mass of a CDF boundary, measured with
`python -m pdserve.chaos.batch_effects --threads 1`).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pdserve.bench.records import OK, RequestRecord
from pdserve.bench.runner import RunResult
from pdserve.bench.workloads import BenchRequest, Kind, Workload
from pdserve.chaos.analysis import Difference
from pdserve.chaos.batch_effects import EffectSpec, first_difference, prompts, requests
from pdserve.chaos.blocks import Drain
from pdserve.chaos.config import ChaosConfig
from pdserve.chaos.harness import Measured, judge
from pdserve.chaos.reference import Reference
from pdserve.chaos.report import format_report
from pdserve.chaos.ties import Call, ReferenceJudge, Rule
from pdserve.requests import Priority

pytestmark = pytest.mark.timeout(900)

SPEC = EffectSpec(seed=0)
PARTING = 11  # the request that parts alone vs together at one thread; others are tried after it
TRIED = 8  # requests run alone at most (each costs a run): PARTING and the seven after it


@pytest.fixture(scope="module")
def reference():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ref = Reference()
    try:
        yield ref
    finally:
        ref.close()
        torch.set_num_threads(threads)


def bench_request(index: int, sampling) -> BenchRequest:
    return BenchRequest(index, 0.0, Kind.CHAT, Priority.NORMAL, prompts(SPEC)[index], sampling.max_tokens,
                        sampling.temperature, sampling.seed)


def difference(index: int, before: tuple[int, ...], after: tuple[int, ...]) -> Difference:
    k = first_difference(before, after)
    assert k is not None
    return Difference(index, True, k, f"request-{index}", (before[k], after[k]), before[:k])


@pytest.fixture(scope="module")
def runs(reference) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Request -> (its tokens alone, its tokens among all 24), for PARTING and, when PARTING does
    not part on this platform, the next ones (TRIED in all) until one does."""
    batch = requests(SPEC, reference)
    together = reference.run(batch)
    found = {}
    for index in [(PARTING + k) % SPEC.prompts for k in range(TRIED)]:
        found[index] = (reference.run([batch[index]])[0].token_ids, together[index].token_ids)
        if found[index][0] != found[index][1]:
            break
    return found


@pytest.fixture(scope="module")
def parted(runs) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(request, alone, together) of the first request that parts. Batch effects are a property of
    the CPU's kernels: on a platform where none of those tried parts, there is no tie to judge."""
    for index, (alone, together) in runs.items():
        if alone != together:
            return index, alone, together
    pytest.skip(f"none of {TRIED} requests' tokens differ alone vs batched on this platform's kernels: no tie "
                "to judge")


def test_a_request_that_parts_alone_vs_batched_is_a_tie(reference, parted):
    index, alone, together = parted
    batch = requests(SPEC, reference)
    judged = ReferenceJudge(lambda: reference).judge(bench_request(index, batch[index][1]),
                                                     difference(index, alone, together))
    assert (judged.call, judged.rule) == (Call.TIE, Rule.SEEDED), judged
    assert judged.margin <= judged.epsilon


def test_the_same_request_drawing_with_its_index_shifted_by_one_is_real(reference, runs):
    index = next(iter(runs))
    alone = runs[index][0]
    prompt, sampling = requests(SPEC, reference)[index]
    shifted = reference.run([([*prompt, alone[0]], replace(sampling, max_tokens=SPEC.tokens - 1))])[0]
    resumed = (alone[0], *shifted.token_ids)  # token n drawn with seeded_uniform(seed, n - 1)
    judged = ReferenceJudge(lambda: reference).judge(bench_request(index, sampling),
                                                     difference(index, alone, resumed))
    assert (judged.call, judged.rule) == (Call.REAL, Rule.SEEDED), judged
    assert judged.margin > 10 * judged.epsilon


class Borrowed:
    """The module's reference, lent to a judge that closes what it loaded."""

    def __init__(self, reference: Reference):
        self.encode, self.logits = reference.encode, reference.logits

    def close(self) -> None:
        pass


def measured(workload: Workload, tokens: tuple[int, ...]) -> Measured:
    (request,) = workload.requests
    record = RequestRecord(request.index, "chat", "normal", request.max_tokens, sent_s=0.0,
                           token_times=[1.0] * len(tokens), token_counts=[1] * len(tokens), token_ids=list(tokens),
                           done_s=1.0, status=OK)
    return Measured(RunResult("in process", workload, 0.0, 1.0, (record,), (0.0, 0.0)), (), Drain(0.0, 1.0, ()),
                    "in process")


def test_the_chaos_verdict_passes_on_the_tie_and_reports_it(reference, parted):
    index, alone, together = parted
    workload = Workload("chaos", 0, 0.0, (replace(bench_request(index, requests(SPEC, reference)[index][1]),
                                                  index=0),))
    result = judge(ChaosConfig(), workload, (), measured(workload, alone), measured(workload, together),
                   ReferenceJudge(lambda: Borrowed(reference)))
    v = result.verdict
    assert (v.seeded_differ, v.seeded_ties) == (0, 1) and v.passed, format_report(result)
    assert "near-ties, not failing" in format_report(result)
