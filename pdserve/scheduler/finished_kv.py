"""What happens to a finished request's device blocks."""

from __future__ import annotations

import abc

from pdserve.kv.manager import BlockHold, KVManager
from pdserve.requests import Request


class FinishedKV(abc.ABC):
    @abc.abstractmethod
    def settle(self, kv: KVManager, request: Request) -> BlockHold | None:
        """Release or hold the request's blocks; a hold is returned for the engine to release."""


class FreeFinished(FinishedKV):
    """Decode and colocated workers: blocks go back at once (full ones stay in the prefix cache)."""

    def settle(self, kv: KVManager, request: Request) -> BlockHold | None:
        kv.free(request)
        return None


class HoldFinished(FinishedKV):
    """Prefill workers: the KV must outlive the request until it is sent to a decode worker."""

    def settle(self, kv: KVManager, request: Request) -> BlockHold | None:
        hold = kv.hold(request) if kv.has_blocks(request.request_id) else None
        kv.free(request)
        return hold


class HoldAll(FinishedKV):
    """A request whose remote KV may still be arriving: every reserved block stays held until
    the engine knows the transfer is over (abort or finish while receiving)."""

    def settle(self, kv: KVManager, request: Request) -> BlockHold | None:
        hold = kv.hold(request, num_tokens=kv.num_blocks(request.request_id) * kv.block_size)
        kv.free(request)
        return hold
