"""Admission guard for VIP requests, which are never preempted for room (a VIP may only take
another VIP's time slice, slicing.py: never for want of blocks).

NOTE: if VIP requests alone could outgrow the pool, they would deadlock: each needs a block,
none may be preempted for one. So a VIP is admitted only while the worst case of every running VIP
(prompt + max_tokens, capped by max_model_len) fits in the device pool; everything else can
always be preempted to make room for them.
"""

from __future__ import annotations

from pdserve.kv.manager import KVManager
from pdserve.requests import Priority, Request
from pdserve.scheduler.state import Queues


class VipReserve:
    def __init__(self, kv: KVManager, queues: Queues, max_model_len: int):
        self._kv = kv
        self._q = queues
        self._max_model_len = max_model_len
        self._worst: dict[str, int] = {}  # worst case of each VIP holding blocks (fixed per request)
        self._held = 0  # their sum, as of `_epoch`
        self._epoch = -1

    def allows(self, request: Request) -> bool:
        if request.priority != Priority.VIP:
            return True
        return self._held_blocks() + self.worst_case_blocks(request) <= self._kv.device.num_blocks

    def _held_blocks(self) -> int:
        """The worst case of every VIP holding blocks, summed again only when that set changed."""
        if self._epoch != self._q.vip_epoch:
            old = self._worst
            self._worst = {rid: old[rid] if rid in old else self.worst_case_blocks(r)
                           for rid, r in self._q.vips.items()}
            self._held, self._epoch = sum(self._worst.values()), self._q.vip_epoch
        return self._held

    def worst_case_blocks(self, request: Request) -> int:
        """NOTE: a request never outgrows prompt + max_tokens: it finishes there."""
        return self._kv.pages_for(min(request.num_prompt_tokens + request.sampling.max_tokens,
                                       self._max_model_len))
