"""The step cost model's coefficients on this machine (pdserve/scheduler/step_cost.py), for chunks
sized by time: four forward passes on the engine's own model, pool and backend, each timed
(the best of REPEATS after a warm-up), solved for the four terms:

    decode 1 row, context c          t1 = fixed + row          + pair * c
    decode R rows, context c each    t2 = fixed + row * R      + pair * R * c
    prefill P tokens from 0          t3 = fixed + token * P    + pair * P (P + 1) / 2
    prefill P tokens from S          t4 = fixed + token * P    + pair * P (S + (P + 1) / 2)

    pair = (t4 - t3) / (P S);  row = (t2 - t1 - pair (R - 1) c) / (R - 1);  fixed = t1 - row - pair c;
    token = (t3 - fixed - pair P (P + 1) / 2) / P          (each at least 0)

Measured once per machine, model, layout and thread count (pdserve/measurements.py), only where
the engine sizes chunks by time. The pool is free at start: the passes write its first blocks,
never read as anyone's KV.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from pdserve.attention.base import AttentionBackend
from pdserve.attention.batch import ForwardBatch
from pdserve.engine.calibration import prefill_batch
from pdserve.engine.decode_probe import decode_batch
from pdserve.kv.kv_cache import KVCache
from pdserve.measurements import measured
from pdserve.scheduler.step_cost import StepCoefficients

log = logging.getLogger(__name__)

ROWS = 32  # R
PROMPT = 128  # P
FAR = 512  # S
REPEATS = 3


def step_cost_at_start(model, kv: KVCache, attn: AttentionBackend, depends_on: dict[str, Any]) -> StepCoefficients:
    """This machine's coefficients, measured now unless kept under `depends_on` (the serving
    identity and the paths chosen before)."""
    key = {**depends_on, "block_size": kv.block_size, "blocks": min(kv.num_blocks, _blocks_needed(kv))}
    cost = StepCoefficients.from_json(measured("step-cost", key, lambda: measure_step_cost(model, kv, attn).to_json()))
    log.info("step cost (measured here): %.1f ms a step, %.3f ms a decode row, %.3f ms a prompt token, "
             "%.2f us per 1000 query-key pairs", cost.fixed_s * 1e3, cost.decode_row_s * 1e3,
             cost.prefill_token_s * 1e3, cost.context_pair_s * 1e9)
    return cost


def measure_step_cost(model, kv: KVCache, attn: AttentionBackend) -> StepCoefficients:
    """The four passes above, scaled down to a pool too small for them."""
    capacity = kv.num_blocks * kv.block_size
    rows, prompt = max(2, min(ROWS, kv.num_blocks)), max(2, min(PROMPT, capacity // 4))
    far = max(1, min(FAR, capacity - prompt))
    context = kv.block_size
    t1, t2 = (_best(model, decode_batch(n, kv), kv, attn) for n in (1, rows))
    t3, t4 = (_best(model, prefill_batch(prompt, start, kv), kv, attn) for start in (0, far))
    pair = max(0.0, (t4 - t3) / (prompt * far))
    row = max(0.0, (t2 - t1 - pair * (rows - 1) * context) / (rows - 1))
    fixed = max(0.0, t1 - row - pair * context)
    token = max(0.0, (t3 - fixed - pair * prompt * (prompt + 1) / 2) / prompt)
    return StepCoefficients(fixed, row, token, pair)


def _blocks_needed(kv: KVCache) -> int:
    return -(-(FAR + PROMPT) // kv.block_size)


def _best(model, batch: ForwardBatch, kv: KVCache, attn: AttentionBackend) -> float:
    best = float("inf")
    with torch.inference_mode():
        for round in range(1 + REPEATS):
            started = time.perf_counter()
            model.forward(batch, kv, attn)
            if kv.data.device.type == "cuda":
                torch.cuda.synchronize(kv.data.device)
            if round:  # round 0 warms up
                best = min(best, time.perf_counter() - started)
    return best
