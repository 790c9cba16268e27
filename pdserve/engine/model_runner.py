"""Executes one SchedulerOutput on the model: swaps, one forward pass, sampling. Never decides."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch
from pdserve.engine.batch_builder import build_forward_batch, prompt_positions
from pdserve.engine.grammar_masks import GrammarMasks
from pdserve.engine.host_logits import HostLogits
from pdserve.kv.kv_cache import KVCache
from pdserve.engine.engine_model import EngineModel
from pdserve.parallel.plan import SwapPlan
from pdserve.sampling.logprobs import TokenLogprobs, token_logprobs
from pdserve.sampling.penalties import adjust_logits
from pdserve.sampling.sampler import Sampler
from pdserve.scheduler.output import SchedulerOutput


@dataclass(frozen=True)
class Sampled:
    """What one step sampled: request id -> token, and -> its logprobs for requests that asked;
    request id -> the prompt log-probabilities this step computed (prompt_positions' order)."""

    tokens: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepTimes:
    swap_s: float
    forward_s: float


class ModelRunner:
    """Owns the device KV pool, the host swap pool and the host logits buffer of one worker."""

    def __init__(self, loaded: EngineModel, kv: KVCache, host_kv: KVCache, attn: AttentionBackend, seed: int,
                 grammar: GrammarMasks):
        self.model = loaded.model
        self.ranks = loaded.ranks  # tensor parallelism: the other ranks repeat every swap
        self.kv = kv
        self.host_kv = host_kv
        self.attn = attn
        self.sampler = Sampler()
        self.device = kv.data.device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.swap_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.host_logits = HostLogits(loaded.config.vocab_size, pinned=self.device.type == "cuda")
        self.grammar = grammar  # structured output: constrained requests' masks

    def execute(self, output: SchedulerOutput) -> Sampled:
        """Run the step; return the sampled token of every chunk that samples (and its logprobs
        where the request asked)."""
        self._swap(output)
        if not output.chunks:
            return Sampled()
        batch = build_forward_batch(output.chunks, self.kv.block_size, self.device, self.kv.groups.count)
        sampling = [c for c in output.chunks if c.samples]
        masks = self.grammar.start([c.request for c in sampling])  # computed while the model runs
        rows = self._logits(batch)  # [S + prompt rows, V] float32 on the host, valid until the next step
        logits = rows[:len(sampling)]  # [S, V]
        prompt = _prompt_logprobs(rows[len(sampling):], output.chunks)
        params = [c.request.sampling for c in sampling]
        chosen_from = adjust_logits(logits, [c.request for c in sampling])  # biases, penalties, min_tokens
        if masks is not None:
            chosen_from = self.grammar.apply(chosen_from, masks, logits)
        tokens = self.sampler.sample(chosen_from, params, [len(c.request.output_token_ids) for c in sampling],
                                     self.generator)
        ids = [c.request.request_id for c in sampling]
        logprobs = token_logprobs(logits, tokens, [p.logprobs for p in params])
        return Sampled(dict(zip(ids, tokens)), {ids[row]: lp for row, lp in logprobs.items()}, prompt)

    def _logits(self, batch: ForwardBatch) -> torch.Tensor:
        """The step's logits in the host buffer: written there by a float32 CPU model's lm_head,
        else copied there (a GPU's, or a CPU model's of another dtype, as float32)."""
        out = self.host_logits.rows(batch.logits_indices.shape[0])
        with torch.inference_mode():
            if self.device.type == "cpu" and self.model.dtype == torch.float32:
                return self.model.forward(batch, self.kv, self.attn, out)
            return out.copy_(self.model.forward(batch, self.kv, self.attn))

    def _swap(self, output: SchedulerOutput) -> None:
        """swap_out before swap_in (a block freed by one may be the target of the other). On a
        GPU the copies run on a side stream; the forward pass waits for them on the device only."""
        if not (output.swap_out or output.swap_in):
            return
        self.ranks.announce(SwapPlan(tuple(output.swap_out), tuple(output.swap_in)))
        if self.swap_stream is None:
            self._copy_swaps(output)
            return
        compute = torch.cuda.current_stream(self.device)
        self.swap_stream.wait_stream(compute)
        with torch.cuda.stream(self.swap_stream):
            self._copy_swaps(output)
        compute.wait_stream(self.swap_stream)

    def _copy_swaps(self, output: SchedulerOutput) -> None:
        self.kv.copy_blocks_to(self.host_kv, list(output.swap_out))
        self.host_kv.copy_blocks_to(self.kv, list(output.swap_in))


def _prompt_logprobs(rows: torch.Tensor, chunks) -> dict[str, list[TokenLogprobs]]:
    """The prompt log-probabilities of `rows` (the logits of every chunk's prompt_positions, in
    order): request id -> entries, each the next prompt token's."""
    if not rows.shape[0]:
        return {}
    targets, asked, owners = [], [], []
    for chunk in chunks:
        request = chunk.request
        for position in prompt_positions(chunk):
            targets.append(request.prompt_token_ids[position + 1])
            asked.append(request.sampling.prompt_logprobs)
            owners.append(request.request_id)
    entries = token_logprobs(rows, targets, asked)
    out: dict[str, list[TokenLogprobs]] = {}
    for row, owner in enumerate(owners):
        out.setdefault(owner, []).append(entries[row])
    return out
