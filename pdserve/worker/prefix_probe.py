"""How much of a prompt a worker's prefix cache holds: what the router's MatchPrefix probes ask
both roles (prefill workers for where to compute, decode workers for where a conversation's
earlier turns already are)."""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.engine.async_engine import AsyncEngine
from pdserve.errors import InvalidRequestError


async def cached_prefix(engine: AsyncEngine, token_ids: Sequence[int]) -> int:
    """Leading tokens of token_ids whose KV the engine's prefix cache holds; InvalidRequestError
    for more ids than a prompt may have."""
    longest = engine.engine.limits.max_model_len
    if len(token_ids) > longest:
        raise InvalidRequestError(f"{len(token_ids)} token ids; a prompt holds at most {longest}")
    ids = list(token_ids)
    return await engine.query(lambda e: e.scheduler.kv.probe(ids))
