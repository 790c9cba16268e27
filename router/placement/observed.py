"""What this router measured of its workers itself, for predicting time to first token
(pdserve/admission/ttft.py): per decode worker how long its reservations took, per prefill worker
how long the last KV piece of a request took to cross, and each decode worker's block size. Moving averages: each new figure weighs
`weight`, so they follow the last several requests."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.config import CacheConfig


@dataclass
class Observed:
    weight: float = 0.3
    _reserve_s: dict[str, float] = field(default_factory=dict)
    _tail_s: dict[str, float] = field(default_factory=dict)
    _block_size: dict[str, int] = field(default_factory=dict)

    def reserved(self, decode: str, seconds: float, block_size: int = 0) -> None:
        """A reservation on `decode` came `seconds` after its Decode call opened; its blocks hold
        `block_size` tokens each."""
        self._blend(self._reserve_s, decode, seconds)
        if block_size > 0:
            self._block_size[decode] = block_size

    def block_size(self, decode: str) -> int:
        """Tokens per KV block on `decode`, as its last reservation said (the default before one)."""
        return self._block_size.get(decode, CacheConfig().block_size)

    def sent(self, prefill: str, kv_seconds: float, pieces: int) -> None:
        """A request's KV left `prefill` in `pieces` pieces that took `kv_seconds` in all."""
        if pieces > 0:
            self._blend(self._tail_s, prefill, kv_seconds / pieces)

    def reserve_s(self, decode: str) -> float:
        return self._reserve_s.get(decode, 0.0)

    def tail_s(self, prefill: str) -> float:
        return self._tail_s.get(prefill, 0.0)

    def _blend(self, table: dict[str, float], address: str, seconds: float) -> None:
        old = table.get(address)
        seconds = max(0.0, seconds)
        table[address] = seconds if old is None else (1 - self.weight) * old + self.weight * seconds
