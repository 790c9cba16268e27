"""How much a row's logits depend on the batch it ran in: `python -m pdserve.chaos.batch_effects`.

The same seeded requests (prompts of random words) through the reference engine three ways:
each alone, all together, all together in reverse order. Printed for two ways: the largest
changes (see Effects) over every position where both still agree on the tokens so far, and the
requests whose tokens part, with where and the two tokens. These figures size the tie judge's
epsilon (see ties).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.bench.text import WORDS
from pdserve.chaos.reference import Generated, Reference
from pdserve.requests import SamplingParams
from pdserve.sampling.filters import SamplingTensors, filtered_probs


@dataclass(frozen=True)
class EffectSpec:
    prompts: int = 24
    words: tuple[int, int] = (30, 90)  # per prompt, drawn from pdserve.bench.text.WORDS
    tokens: int = 20
    temperature: float = 0.8
    seed: int = 0


@dataclass(frozen=True)
class Parting:
    request: int
    index: int  # the first token position where the two ways differ
    tokens: tuple[int, int]  # (this way, the other way) at `index`


@dataclass(frozen=True)
class Effects:
    """The largest change between two ways, over every position whose context both share:

    logprob    |log_softmax a - log_softmax b| of any token (top20: of a's 20 most likely)
    gap        |(l1 - l2) in a - (l1 - l2) in b|, l1 and l2 a's two largest logits (greedy's margin)
    cdf        |cdf a / T a - cdf b / T b| at any vocabulary index, after the request's filters
               (where a seeded draw's boundaries are, as a fraction of the mass)
    """

    logprob: float
    logprob_top20: float
    gap: float
    cdf: float
    partings: tuple[Parting, ...]


def prompts(spec: EffectSpec) -> list[str]:
    rng = random.Random(f"batch-effects:{spec.seed}")
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*spec.words))) for _ in range(spec.prompts)]


def sampling(spec: EffectSpec, request: int) -> SamplingParams:
    return SamplingParams(max_tokens=spec.tokens, temperature=spec.temperature, seed=spec.seed * 1000 + request,
                          ignore_eos=True)


def requests(spec: EffectSpec, reference: Reference) -> list[tuple[list[int], SamplingParams]]:
    return [(reference.encode(p), sampling(spec, i)) for i, p in enumerate(prompts(spec))]


def alone(reference: Reference, batch: Sequence[tuple[list[int], SamplingParams]]) -> list[Generated]:
    return [reference.run([r], keep_logits=True)[0] for r in batch]


def together(reference: Reference, batch: Sequence[tuple[list[int], SamplingParams]],
             reverse: bool = False) -> list[Generated]:
    if not reverse:
        return reference.run(batch, keep_logits=True)
    return reference.run(batch[::-1], keep_logits=True)[::-1]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def shared(a: Generated, b: Generated) -> int:
    """How many positions have the same context in both: up to and including the first difference."""
    parted = first_difference(a.token_ids, b.token_ids)
    return len(a.logits) if parted is None else parted + 1


def _cdf(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    probs = filtered_probs(logits[None].float(), SamplingTensors.from_params([params], logits.device))[0]  # [V]
    cdf = probs.double().cumsum(dim=-1)  # [V]
    return cdf / cdf[-1]


def _changes(a: torch.Tensor, b: torch.Tensor, params: SamplingParams) -> tuple[float, float, float, float]:
    """a, b: [V] logits of one position in two ways -> (logprob, logprob_top20, gap, cdf)."""
    la, lb = torch.log_softmax(a.double(), dim=-1), torch.log_softmax(b.double(), dim=-1)  # [V]
    delta = (la - lb).abs()
    top = la.topk(min(20, la.shape[-1])).indices
    gap = abs((la[top[0]] - la[top[1]]) - (lb[top[0]] - lb[top[1]])).item()
    cdf = (_cdf(a, params) - _cdf(b, params)).abs().max().item()
    return delta.max().item(), delta[top].max().item(), gap, cdf


def compare(first: Sequence[Generated], second: Sequence[Generated], params: Sequence[SamplingParams]) -> Effects:
    partings = tuple(Parting(i, k, (a.token_ids[k], b.token_ids[k])) for i, (a, b) in enumerate(zip(first, second))
                     if (k := first_difference(a.token_ids, b.token_ids)) is not None)
    changes = [_changes(x, y, p) for a, b, p in zip(first, second, params)
               for x, y in zip(a.logits[:shared(a, b)], b.logits[:shared(a, b)])]
    return Effects(*(max(column) for column in zip(*changes)), partings)


def _line(label: str, effects: Effects, spec: EffectSpec) -> str:
    parts = ", ".join(f"#{p.request} at {p.index} ({p.tokens[0]} vs {p.tokens[1]})" for p in effects.partings)
    return (f"{label:22} logprob {effects.logprob:.1e} (top 20: {effects.logprob_top20:.1e}), "
            f"top-two gap {effects.gap:.1e}, cdf {effects.cdf:.1e}; tokens differ in "
            f"{len(effects.partings)}/{spec.prompts}{': ' + parts if parts else ''}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=EffectSpec.prompts)
    p.add_argument("--tokens", type=int, default=EffectSpec.tokens)
    p.add_argument("--seed", type=int, default=EffectSpec.seed)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = EffectSpec(prompts=args.prompts, tokens=args.tokens, seed=args.seed)
    reference = Reference()
    batch = requests(spec, reference)
    one, many, reversed_ = alone(reference, batch), together(reference, batch), together(reference, batch, True)
    params = [s for _, s in batch]
    print(f"{spec.prompts} prompts of {spec.words[0]}-{spec.words[1]} words, {spec.tokens} tokens, "
          f"seeded, temperature {spec.temperature}, seed {spec.seed}, {torch.get_num_threads()} threads; "
          "the largest change of:")
    print(_line("alone vs together", compare(one, many, params), spec))
    print(_line("together vs reversed", compare(many, reversed_, params), spec))


if __name__ == "__main__":
    main()
