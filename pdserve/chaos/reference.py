"""The reference a near-tie is judged against: the fleet's model run in this process.

One request at a time through a real `LLM` (the engine's own chunked prefill, attention backend and
model), so the logits are those a worker would compute for the same tokens, up to the batch
effects the tie judge tolerates. The logits are taken from the engine's sampler: the runner's
`sampler` is replaced by one that samples exactly as `Sampler` does and keeps the last row it saw.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.requests import SamplingParams, TokenLogprobs
from pdserve.sampling.sampler import Sampler


@dataclass(frozen=True)
class ReferenceSpec:
    """The engine the reference runs: the fleet's model on the CPU in fp32, with a small KV pool
    and no prefix cache (each `logits` call is a whole prefill, whatever came before)."""

    model: str | None = None  # None: the embedded SmolLM2, as the chaos fleet's workers run
    kv_blocks: int = 256  # 4,096 tokens: the longest chaos document and its output fit
    host_kv_blocks: int = 16


@dataclass(frozen=True)
class Generated:
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprobs, ...]  # one per token when the sampling asked for them
    logits: tuple[torch.Tensor, ...] = ()  # [V] float32 per token, when `run` was asked to keep them


class RecordingSampler(Sampler):
    """`Sampler`, keeping the logits row of the last step that sampled anything, and with `keep`
    every row: (the row's SamplingParams object, its token index, logits [V])."""

    def __init__(self) -> None:
        self.last: torch.Tensor | None = None  # [V] float32
        self.keep = False
        self.rows: list[tuple[SamplingParams, int, torch.Tensor]] = []

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams], token_indices: Sequence[int],
               generator: torch.Generator) -> list[int]:
        if logits.shape[0]:
            self.last = logits[-1].detach().clone()
        if self.keep:
            self.rows += [(p, n, logits[row].detach().clone()) for row, (p, n) in enumerate(zip(params, token_indices))]
        return super().sample(logits, params, token_indices, generator)


class Reference:
    """Loads the model once (seconds); `logits` then costs one prefill of prompt + prefix."""

    def __init__(self, spec: ReferenceSpec = ReferenceSpec()):
        from pdserve.config import CacheConfig, EngineConfig
        from pdserve.engine.llm import LLM

        cache = CacheConfig(num_blocks=spec.kv_blocks, num_host_blocks=spec.host_kv_blocks, prefix_cache=False)
        self.llm = LLM(EngineConfig(model=spec.model, device="cpu", dtype="float32", cache=cache))
        self.recorder = RecordingSampler()
        self.llm.engine.runner.sampler = self.recorder
        self._ids = itertools.count()

    def encode(self, prompt: str) -> list[int]:
        """As the router encodes a text prompt."""
        return self.llm.encode(prompt)

    def logits(self, prompt_ids: Sequence[int], prefix: Sequence[int]) -> torch.Tensor:
        """The model's raw logits [V] float32 for the token after prompt_ids + prefix."""
        self.recorder.last = None
        self.llm.generate([[*prompt_ids, *prefix]], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        if self.recorder.last is None:
            raise RuntimeError("the reference engine finished the request without sampling a token")
        return self.recorder.last

    def run(self, requests: Sequence[tuple[Sequence[int], SamplingParams]], keep_logits: bool = False
            ) -> list[Generated]:
        """All the requests (prompt ids, sampling) together, continuously batched, to the end."""
        engine = self.llm.engine
        ids = [f"reference-{next(self._ids)}" for _ in requests]
        made = {i: engine.add_request(i, list(p), dataclasses.replace(s)) for i, (p, s) in zip(ids, requests)}
        logprobs: dict[str, list[TokenLogprobs]] = {i: [] for i in ids}
        self.recorder.keep, self.recorder.rows = keep_logits, []
        try:
            while any(not r.is_finished for r in made.values()):
                for out in engine.step().outputs:
                    logprobs[out.request_id].extend(out.logprobs)
        finally:
            self.recorder.keep = False
        return [Generated(tuple(made[i].output_token_ids), tuple(logprobs[i]), self._logits_of(made[i].sampling))
                for i in ids]

    def _logits_of(self, sampling: SamplingParams) -> tuple[torch.Tensor, ...]:
        """The kept rows of the request whose SamplingParams object this is (each request got its
        own copy), in token order."""
        mine = sorted(((n, logits) for p, n, logits in self.recorder.rows if p is sampling), key=lambda row: row[0])
        return tuple(logits for _, logits in mine)

    def close(self) -> None:
        self.llm.close()
