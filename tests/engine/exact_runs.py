"""Running requests through deterministic engines and keeping what must come out bitwise equal:
each request's tokens with the raw log-probabilities of each (its logits' fingerprint). The
handoffs between two engines copy KV blocks as the workers' transports do: a prefill engine's
into a decode engine's reservation, a departing request's held blocks into a new engine's."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdserve.config import CacheConfig, EngineConfig, PreemptionConfig, SchedulerConfig
from pdserve.cpu.transform import apply_cpu_paths
from pdserve.engine.engine import Engine
from pdserve.engine.outputs import StepResult
from pdserve.model.loader import LoadedModel
from pdserve.requests import Priority, SamplingParams

Output = tuple[tuple[int, float, tuple], ...]  # per token: (id, logprob, top logprobs)


@dataclass(frozen=True)
class Ask:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    priority: Priority = Priority.NORMAL
    at: int = 0  # added before this step


def deterministic_model(loaded: LoadedModel) -> LoadedModel:
    """A copy of `loaded` on deterministic mode's CPU paths (the session's model stays as it is)."""
    model = copy.deepcopy(loaded.model)
    apply_cpu_paths(model, "auto", "auto", "cpu", torch.float32, deterministic=True)
    return dataclasses.replace(loaded, model=model)


def exact_engine(loaded: LoadedModel, *, num_blocks: int = 512, num_host_blocks: int = 0, token_budget: int = 256,
                 max_chunk_tokens: int = 1024, prefix_cache: bool = True,
                 preemption: PreemptionConfig = PreemptionConfig(), hold_blocks: bool = False) -> Engine:
    cache = CacheConfig(block_size=4, num_blocks=num_blocks, num_host_blocks=num_host_blocks, prefix_cache=prefix_cache)
    scheduler = SchedulerConfig(policy="chunked", token_budget=token_budget, max_chunk_tokens=max_chunk_tokens,
                                aging_seconds=None, preemption=preemption)
    return Engine(EngineConfig(cache=cache, scheduler=scheduler, deterministic=True), loaded=loaded,
                  hold_blocks=hold_blocks)


@dataclass
class Run:
    outputs: dict[str, list] = dataclasses.field(default_factory=dict)
    preemption_modes: set[str] = dataclasses.field(default_factory=set)
    cached_tokens: int = 0  # prompt tokens the prefix cache served

    def output(self, request_id: str) -> Output:
        return tuple(self.outputs[request_id])


def step(engine: Engine, run: Run) -> StepResult:
    result = engine.step()
    engine.scheduler.check_integrity()
    run.preemption_modes |= {p.mode.value for p in result.preemptions}
    for out in result.outputs:
        run.outputs.setdefault(out.request_id, []).extend((lp.token_id, lp.logprob, lp.top) for lp in out.logprobs)
    return result


def drive(engine: Engine, asks: Sequence[Ask], max_steps: int = 5000) -> Run:
    """Every ask added at its step, stepped until all finished."""
    run, pending, steps, requests = Run(), sorted(asks, key=lambda a: a.at), 0, []
    while pending or engine.has_unfinished():
        while pending and pending[0].at <= steps:
            ask = pending.pop(0)
            requests.append(engine.add_request(ask.request_id, ask.prompt, ask.sampling, ask.priority))
            run.outputs[ask.request_id] = []
        assert steps < max_steps
        step(engine, run)
        steps += 1
    run.cached_tokens = sum(r.num_cached_tokens for r in requests)
    return run


def copy_blocks(src: Engine, dst: Engine, src_blocks: Sequence[int], dst_blocks: Sequence[int], skip: int) -> None:
    """The KV of block i of src_blocks into block i of dst_blocks, from block `skip` on (the ones
    before were cached at the destination)."""
    for source, target in list(zip(src_blocks, dst_blocks))[skip:]:
        dst.kv.data[target].copy_(src.kv.data[source])


def prefilled_elsewhere(prefill: Engine, decode: Engine, ask: Ask) -> Output:
    """`ask` prefilled by `prefill` (its first token sampled there), its KV copied into blocks
    `decode` reserved, and decoded there to its end."""
    run = Run()
    decode.add_remote_request(ask.request_id, ask.prompt, ask.sampling, ask.priority)
    reservation = step(decode, run).reserved[0]
    first_only = dataclasses.replace(ask.sampling, max_tokens=1)
    prefill.add_request(ask.request_id, ask.prompt, first_only, ask.priority)
    while prefill.has_unfinished():
        hold = step(prefill, run).holds.get(ask.request_id)
    copy_blocks(prefill, decode, hold.blocks, reservation.block_ids, reservation.cached_blocks)
    prefill.release(hold)
    decode.mark_received(ask.request_id, run.outputs[ask.request_id][0][0])
    while decode.has_unfinished():
        step(decode, run)
    return run.output(ask.request_id)


def moved(source: Engine, target: Engine, ask: Ask, run: Run) -> None:
    """`ask`, decoding on `source`, detached with its KV and moved into `target` (every token but
    the last as its tokens so far, the last fed first), as a departing decode worker's request."""
    detached = source.detach(ask.request_id)
    assert detached is not None, "not decoding"
    tokens = list(detached.output_token_ids)
    target.add_remote_request(ask.request_id, ask.prompt, ask.sampling, ask.priority, output_token_ids=tokens[:-1])
    while not (reserved := step(target, run).reserved):
        pass
    copy_blocks(source, target, detached.hold.blocks, reserved[0].block_ids, reserved[0].cached_blocks)
    source.release(detached.hold)
    target.mark_received(ask.request_id, tokens[-1])
