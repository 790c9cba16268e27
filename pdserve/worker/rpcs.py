"""The RPCs both worker roles answer alike (MatchPrefix, Abort, Stats), for their servicers to
inherit: each servicer sets `role` and has `worker` (with `engine`, `abort` and `kv_rank_bytes`)
and `draining`."""

from __future__ import annotations

from pdserve.rpc.stats import stats_to_pb
from pdserve.v1 import worker_pb2 as wpb
from pdserve.worker.prefix_probe import cached_prefix


class CommonWorkerRpcs:
    role: str

    async def MatchPrefix(self, request: wpb.MatchPrefixRequest, context) -> wpb.MatchPrefixResponse:
        return wpb.MatchPrefixResponse(cached_tokens=await cached_prefix(self.worker.engine, request.token_ids))

    async def Abort(self, request: wpb.WorkerAbortRequest, context) -> wpb.WorkerAbortResponse:
        return wpb.WorkerAbortResponse(found=await self.worker.abort(request.request_id))

    async def Stats(self, request: wpb.StatsRequest, context) -> wpb.WorkerStats:
        stats = stats_to_pb(self.role, self.worker.engine.stats, self.draining.draining)
        stats.kv_rank_bytes.extend(self.worker.kv_rank_bytes())
        return stats
