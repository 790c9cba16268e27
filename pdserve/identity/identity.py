"""A worker's compatibility identity: its model's fingerprint and what shapes the KV it computes.
Two workers may exchange KV only when every field agrees but the tensor-parallel layout (the
senders map heads across layouts, pdserve/parallel/kv_ranks.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import xxhash

from pdserve.identity.fingerprint import ModelFingerprint

PROTOCOL = 1  # the worker protocol (worker.proto's meaning of its fields); bumped when it changes


@dataclass(frozen=True)
class WorkerIdentity:
    model: ModelFingerprint
    kv_dtype: str  # the KV pool's element type ("torch.float32")
    block_size: int
    protocol: int = PROTOCOL
    tensor_parallel_size: int = 1  # shown, never compared

    def differences(self, other: "WorkerIdentity") -> tuple[str, ...]:
        """The fields on which KV of one could not be read by the other, by name ("weights", ...)."""
        fields = [*self.model.differences(other.model)]
        fields += [name for name in ("kv_dtype", "block_size", "protocol") if getattr(self, name) != getattr(other, name)]
        return tuple(fields)

    @property
    def kv_digest(self) -> str:
        """One value of every compared field: a reservation carries it, the sender checks its own."""
        compared = {**dataclasses.asdict(self.model), "kv_dtype": self.kv_dtype, "block_size": self.block_size,
                    "protocol": self.protocol}
        return xxhash.xxh3_64_hexdigest(repr(sorted(compared.items())).encode())
