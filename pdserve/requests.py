"""A request's life inside one engine: its tokens, sampling settings, priority and state.

Pure Python: no tensors, no wire types. The scheduler, the KV manager, the engine and the
simulator all share this one type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Priority(enum.IntEnum):
    """Lower value is served first. VIP is never preempted; BATCH is the preemptible cushion."""

    VIP = 0
    NORMAL = 1
    BATCH = 2


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"


class RequestState(enum.IntEnum):
    """Ordered: every state after RUNNING is terminal."""

    WAITING = 0  # never admitted, or preempted by recompute (KV freed)
    SWAPPED = 1  # preempted by swap: KV lives in the host pool
    RUNNING = 2  # holds device blocks; prefilling or decoding
    FINISHED = 3


class PreemptionMode(enum.Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


class ConstraintKind(enum.Enum):
    """What a structured-output constraint's `spec` holds (pdserve/grammar)."""

    JSON_SCHEMA = "json_schema"  # a JSON schema, as JSON text: the output is JSON it accepts
    JSON_OBJECT = "json_object"  # any JSON object (spec empty)
    REGEX = "regex"  # the whole output matches this regular expression
    GRAMMAR = "grammar"  # a context-free grammar: Lark syntax, or GBNF (rules written `::=`)
    CHOICE = "choice"  # the output is exactly one of `choices` (spec empty)


@dataclass(frozen=True)
class Constraint:
    """A structured-output constraint: every token sampled keeps the output a prefix of a string
    the grammar accepts, and the end of sequence comes only where the grammar allows it."""

    kind: ConstraintKind
    spec: str = ""
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling settings. `temperature == 0` means greedy.

    `logprobs`: None = none; 0 = each sampled token's log-probability; k in 1..20 = also the k
    most likely tokens (see pdserve/sampling/logprobs.py for what is computed)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    # Applied to the logits before any token is chosen, greedy too (pdserve/sampling/penalties.py):
    presence_penalty: float = 0.0  # subtracted from every token already generated
    frequency_penalty: float = 0.0  # subtracted once per time a token was generated
    repetition_penalty: float = 1.0  # tokens of the prompt or the output: positive logits / it, negative * it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), ids ascending
    min_tokens: int = 0  # no end of sequence (EOS, stop token ids) before this many tokens
    constraint: Constraint | None = None  # structured output (pdserve/grammar)
    # Each prompt token's log-probability given the tokens before it (the first has none), with the
    # k most likely (0..20); None: none. Computed where the prompt is, with no prefix-cache hit.
    prompt_logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens)


@dataclass(frozen=True)
class Usage:
    """What a finished request cost, as the public API reports it."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from a prefix cache instead of computed
    preemptions: int = 0
    recompute_preemptions: int = 0
    swap_preemptions: int = 0
    kv_transfer_bytes: int = 0  # KV moved from prefill to decode workers
    decode_cached_tokens: int = 0  # prompt tokens the decode worker held already (an earlier turn)
    local_prefill: bool = False  # the decode worker prefilled the prompt itself


@dataclass(eq=False)
class Request:
    """One generation request as an engine sees it.

    NOTE: `num_computed_tokens` counts the leading tokens of `all_token_ids` whose KV is in
    device blocks (including prefix-cache hits). A request needs a forward pass over
    `all_token_ids[num_computed_tokens:]`; when that reaches the end, a token is sampled.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: Priority = Priority.NORMAL
    arrival_time: float = 0.0
    # Seconds it had already waited before it came here: a hand-over (a resume or retry placed by
    # the router after a fault elsewhere) enters the queue as if it had arrived that long ago.
    age_s: float = 0.0
    eos_token_ids: tuple[int, ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    state: RequestState = RequestState.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache on first admission
    # A resume whose KV a prefill worker writes: how many of output_token_ids (generated
    # elsewhere before) that KV covers besides the prompt's (see num_remote_tokens).
    num_remote_outputs: int = 0
    num_preemptions: int = 0
    # Its KV is sent to another worker (a prefill worker's request): the engine holds its blocks
    # after every step that computes it and at its finish, until the send gives them back.
    sends_kv: bool = False
    finish_reason: FinishReason | None = None
    first_scheduled_time: float | None = None  # when its first chunk was scheduled (queue time)
    # Set by the scheduler: order of first arrival (queue place survives preemption) and of the
    # latest admission (victim choice: most recently admitted first).
    arrival_seq: int = -1
    admit_seq: int = -1
    # sampling.prompt_logprobs: entry j is prompt token j + 1's, from the logits at position j
    # (a recompute computes those positions again; only the missing ones are kept).
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs_reported: bool = False  # given out with its first token (RequestOutput.prompt_logprobs)

    @property
    def prompt_logprobs_missing(self) -> bool:
        """It asks for prompt log-probabilities that are not all computed yet."""
        return (self.sampling.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_remote_tokens(self) -> int:
        """The tokens whose KV a prefill worker writes, for a request decoded from remote KV."""
        return len(self.prompt_token_ids) + self.num_remote_outputs

    @property
    def is_finished(self) -> bool:
        return self.state == RequestState.FINISHED

    @property
    def is_prefilling(self) -> bool:
        """True while more than one token lacks KV (a decode step computes exactly one)."""
        return self.num_tokens - self.num_computed_tokens > 1


@dataclass(frozen=True)
class TokenLogprobs:
    """One sampled token's log-probability and its best alternatives (see pdserve/sampling/logprobs.py)."""

    token_id: int  # the sampled token
    logprob: float  # its log-probability
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob) of the k most likely, best first
