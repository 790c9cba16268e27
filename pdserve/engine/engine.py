"""The in-process engine: add requests, step, read new tokens, abort.

    loop:  output = scheduler.schedule()      # policy: who runs, who is preempted
           sampled = runner.execute(output)   # mechanism: swaps, forward, sampling
           finished = scheduler.update(output, sampled.tokens)

Token level only; text in and out lives in pdserve/engine/llm.py and in the router.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import torch

from pdserve.attention import make_attention_backend
from pdserve.config import EngineConfig
from pdserve.cpu.row_independent import row_independent
from pdserve.engine.start_probes import measure_at_start, with_preemption
from pdserve.errors import DuplicateRequestError, InvalidRequestError, OverloadedError
from pdserve.engine.grammar_masks import GrammarMasks, grammar_backend
from pdserve.engine.model_runner import ModelRunner, Sampled
from pdserve.engine.outputs import AbortResult, Detached, RequestOutput, StepResult
from pdserve.validation import Limits, validate_age, validate_request, validate_resumed
from pdserve.kv.kv_cache import kv_pools
from pdserve.model.dtypes import kv_cache_dtype, serving_dtype
from pdserve.engine.engine_model import EngineModel, load_engine_model
from pdserve.model.loader import LoadedModel
from pdserve.requests import FinishReason, Priority, Request, RequestState, SamplingParams
from pdserve.kv.manager import BlockHold
from pdserve.scheduler import AdmissionError as SchedulerAdmissionError
from pdserve.scheduler import DuplicateRequestError as SchedulerDuplicateError
from pdserve.scheduler import QueueFullError, make_scheduler
from pdserve.scheduler.output import SchedulerOutput
from pdserve.scheduler.results import Reservation
from pdserve.start_phases import StartPhases

ReservedListener = Callable[[tuple[Reservation, ...]], None]
DecidedListener = Callable[[], None]  # runs once the step's scheduling decision is made, under the lock


class Engine:
    def __init__(self, config: EngineConfig, loaded: EngineModel | LoadedModel | None = None,
                 clock: Callable[[], float] = time.monotonic, hold_blocks: bool = False,
                 phases: StartPhases | None = None):
        """`loaded`: the model to run (a LoadedModel runs as it is, on one rank), else the one
        `config` names, loaded here. `hold_blocks` (prefill workers): every request's KV is sent on
        (the default of `add_request`'s `sends_kv`): its blocks are handed out as holds in
        StepResult.holds, to be given back with `release` once their KV was sent. `phases`: the
        start's phase log, which the engine's own phases join."""
        phases = phases if phases is not None else StartPhases()
        self.config = config
        self.clock = clock
        self.hold_blocks = hold_blocks
        self._senders: set[Request] = set()  # live requests whose KV is sent on (Request.sends_kv)
        self.lock = threading.Lock()  # held while the scheduler's state changes (see step)
        dtype = serving_dtype(config.dtype, config.device)
        kv_dtype = kv_cache_dtype(config.cache.kv_dtype, dtype, config.device)
        self.loaded = _engine_model(loaded) if loaded is not None else load_engine_model(config, phases)
        if config.deterministic and not row_independent(self.loaded.model):
            raise ValueError("deterministic mode: the model's projections are not laid out row by row "
                             "(apply_cpu_paths(..., deterministic=True) does it)")
        self.model_config = self.loaded.config
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.model_config.max_position_embeddings)
        groups = self.model_config.page_groups()
        self.kv, self.host_kv = kv_pools(self.model_config.kv_shape(config.cache.block_size), groups,
                                         config.cache.num_blocks, config.cache.num_host_blocks, kv_dtype,
                                         config.device)
        attn = make_attention_backend(config.attention_backend, torch.device(config.device), kv_dtype,
                                      config.deterministic, compute_dtype=dtype)
        self.runner = ModelRunner(self.loaded, self.kv, self.host_kv, attn, config.seed,
                                  GrammarMasks(lambda: grammar_backend(config.model, self.model_config)))
        phases.done("kv pools and runner")
        self.measured = measure_at_start(config, self.loaded, self.kv, self.host_kv, attn, dtype, phases)
        sched_cfg = with_preemption(config, self.measured)
        self.scheduler = make_scheduler(
            sched_cfg, config.cache, self.kv_bytes_per_token, self.max_model_len, clock,
            hold_finished=hold_blocks, groups=groups, step_cost=self.measured.step_cost,
        )
        phases.done("scheduler")

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv.block_nbytes // self.kv.block_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.model_config.eos_token_ids)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams = SamplingParams(),
        priority: Priority = Priority.NORMAL,
        output_token_ids: Sequence[int] = (),
        age_s: float = 0.0,
        sends_kv: bool | None = None,
    ) -> Request:
        """Validate and queue a request (with `output_token_ids`: resume one whose tokens so far
        were produced elsewhere; they are re-prefilled; `age_s`: queue it as if it had arrived
        that long ago; `sends_kv`: its KV is sent on, so its blocks are held (None: as the engine's
        hold_blocks)). Raises InvalidRequestError, DuplicateRequestError, OverloadedError;
        nothing else in the engine changes then."""
        request = self.make_request(request_id, prompt_token_ids, sampling, priority, output_token_ids, age_s)
        request.sends_kv = self.hold_blocks if sends_kv is None else sends_kv
        self._queue(self.scheduler.add, request)
        if request.sends_kv:
            self._senders.add(request)
        return request

    def add_remote_request(self, request_id: str, prompt_token_ids: Sequence[int],
                           sampling: SamplingParams = SamplingParams(),
                           priority: Priority = Priority.NORMAL, output_token_ids: Sequence[int] = (),
                           age_s: float = 0.0) -> Request:
        """Queue a request whose KV a prefill worker will write into blocks reserved here
        (StepResult.reserved lists them): of the prompt, and for a resume (`output_token_ids`,
        produced elsewhere) of those tokens too; `mark_received` starts its decoding."""
        request = self.make_request(request_id, prompt_token_ids, sampling, priority, output_token_ids, age_s)
        self._queue(lambda r: self.scheduler.add_remote(r, r.num_tokens), request)
        return request

    def _queue(self, add: Callable[[Request], None], request: Request) -> None:
        try:
            add(request)
        except QueueFullError as exc:
            raise OverloadedError(str(exc)) from exc
        except SchedulerDuplicateError as exc:
            raise DuplicateRequestError(str(exc)) from exc
        except SchedulerAdmissionError as exc:
            raise InvalidRequestError(str(exc)) from exc

    def mark_received(self, request_id: str, first_token: int) -> None:
        self.scheduler.mark_received(request_id, first_token)

    def release(self, hold: BlockHold) -> None:
        self.scheduler.release_hold(hold)

    def make_request(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingParams,
                     priority: Priority, output_token_ids: Sequence[int] = (), age_s: float = 0.0) -> Request:
        """A validated request; with `output_token_ids`, a resume's tokens so far; `age_s` old."""
        if self.scheduler.get(request_id) is not None:
            raise DuplicateRequestError(f"request_id {request_id!r} is already running")
        validate_request(prompt_token_ids, sampling, self.limits)
        validate_resumed(output_token_ids, sampling, self.limits)
        request = Request(request_id, list(prompt_token_ids), sampling, Priority(priority),
                          arrival_time=self.clock(), age_s=validate_age(age_s), eos_token_ids=self.eos_token_ids,
                          output_token_ids=list(output_token_ids))
        self.runner.grammar.admit(request)
        return request

    @property
    def limits(self) -> Limits:
        cache = self.config.cache
        return Limits(self.model_config.vocab_size, self.max_model_len, cache.num_blocks * cache.block_size)

    def step(self, on_reserved: ReservedListener | None = None,
             on_decided: DecidedListener | None = None) -> StepResult:
        """One step. The scheduler's state changes only under `self.lock` (schedule, update),
        never during the forward pass, so a read-only query holding the lock (a prefix probe)
        waits for a scheduling decision, not for the model. Blocks reserved for remote
        requests are reported once: to `on_reserved` as soon as they are allocated, before the
        forward pass, when it is given; else in StepResult.reserved. `on_decided` runs right
        after the scheduling decision, still under the lock (AsyncEngine's stats as decided).
        NOTE: a step that swaps out reports them after its copies: a block its swap-out frees may
        be reserved in the same step, and a remote write must not land before the copy reads it."""
        started = time.perf_counter()
        with self.lock:
            output = self.scheduler.schedule()
            reserved = tuple(self.scheduler.take_reserved())
            if on_decided is not None:
                on_decided()
        self._stamp_first_scheduled(output)
        if on_reserved is not None and reserved and not output.swap_out:
            on_reserved(reserved)
            reserved = ()
        sampled = self.runner.execute(output)
        if on_reserved is not None and reserved:
            on_reserved(reserved)
            reserved = ()
        if sampled.prompt_logprobs:  # (rare: only requests that ask, while they prefill)
            for chunk in output.chunks:
                chunk.request.prompt_logprobs.extend(sampled.prompt_logprobs.get(chunk.request.request_id, ()))
        with self.lock:
            finished = self.scheduler.update(output, sampled.tokens)
            holds = self._holds(output)
        outputs = self._outputs(output, sampled, finished)
        seconds = time.perf_counter() - started
        self.scheduler.observe(output, seconds)
        return StepResult(outputs, output.preempted, output.resumed, output.chunks, output.num_tokens,
                          seconds, reserved, holds)

    def _holds(self, output: SchedulerOutput) -> dict:
        """Finished requests' holds, and a hold on every request whose KV is sent on
        (Request.sends_kv) still running that this step computed: its new KV can be sent while
        later steps run."""
        holds = self.scheduler.take_holds()
        if not self._senders:  # a decode worker's steps: nothing to hold, no walk over its decodes
            return holds
        for chunk in output.chunks:
            rid = chunk.request.request_id
            if chunk.request.sends_kv and rid not in holds and (hold := self.scheduler.hold(rid)) is not None:
                holds[rid] = hold
        self._senders = {r for r in self._senders if r.state != RequestState.FINISHED}
        return holds

    def _stamp_first_scheduled(self, output: SchedulerOutput) -> None:
        now = self.clock()
        for chunk in output.chunks:
            if chunk.request.first_scheduled_time is None:
                chunk.request.first_scheduled_time = now

    def _outputs(self, output: SchedulerOutput, sampled: Sampled, finished: list[Request]) -> tuple[RequestOutput, ...]:
        done = {r.request_id for r in finished} | {r.request_id for r in output.finished}
        results = [RequestOutput(c.request, (sampled.tokens[rid],), rid in done,
                                 (sampled.logprobs[rid],) if rid in sampled.logprobs else (), _prompt_logprobs(c.request))
                   for c in output.chunks if (rid := c.request.request_id) in sampled.tokens]
        seen = {r.request_id for r in results}
        results += [RequestOutput(r, (), True) for r in (*output.finished, *finished) if r.request_id not in seen]
        return tuple(results)

    def finish(self, request_id: str, reason: FinishReason) -> None:
        """End a request for a reason found above the token level (a stop string)."""
        self.scheduler.finish(request_id, reason)

    def abort(self, request_id: str) -> AbortResult:
        """End a request in any state. Blocks a transfer may still touch (a prefill worker's, or
        a decode worker's request still receiving KV) come back as holds: release them once the
        transfer is withdrawn."""
        found = self.scheduler.abort(request_id) is not None
        return AbortResult(found, tuple(self.scheduler.take_holds().values()) if found else ())

    def detach(self, request_id: str) -> Detached | None:
        """A decoding request leaves this engine, its KV held for a move to another worker (the
        scheduler's `detach`); release the hold once the KV was sent. None, and nothing changed,
        when it is not decoding now."""
        request = self.scheduler.get(request_id)
        hold = self.scheduler.detach(request_id)
        if hold is None or request is None:
            return None
        return Detached(hold, tuple(request.output_token_ids))

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()


def _engine_model(loaded: EngineModel | LoadedModel) -> EngineModel:
    return loaded if isinstance(loaded, EngineModel) else EngineModel.alone(loaded)


def _prompt_logprobs(request: Request) -> tuple:
    """A request's prompt log-probabilities, once: with the first token sampled for it here."""
    if request.sampling.prompt_logprobs is None or request.prompt_logprobs_reported:
        return ()
    request.prompt_logprobs_reported = True
    return tuple(request.prompt_logprobs)
