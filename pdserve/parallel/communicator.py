"""The collectives a model shard calls, behind one interface with two implementations:

    TorchDistributedCommunicator   one process per rank: torch.distributed (gloo on CPU, NCCL on CUDA)
    InProcessGroup(n).communicator(r)   ranks as threads of one process; n = 1 is the identity

Every rank calls the same collectives in the same order; each returns once all ranks called it.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from datetime import timedelta

import torch


class CollectiveError(RuntimeError):
    """A collective could not complete: another rank is gone or did not call it in time."""


class Communicator(ABC):
    rank: int
    world_size: int

    @abstractmethod
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks, written into `x` (returned). Equal on every rank."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., n] on each rank -> [..., world_size * n], the ranks' parts in rank order."""

    def close(self) -> None:
        """Leave the group (nothing to do for most implementations)."""


class InProcessGroup:
    """`world_size` ranks that are threads of this process, meeting at a barrier. The sums are
    taken in rank order, so every rank holds the same bits."""

    def __init__(self, world_size: int, timeout_s: float = 60.0):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._slots: list[torch.Tensor | None] = [None] * world_size

    def communicator(self, rank: int) -> "InProcessCommunicator":
        return InProcessCommunicator(self, rank)

    def exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's tensor, in rank order (each rank passes its own)."""
        if self.world_size == 1:
            return [x]
        self._slots[rank] = x
        self._wait()
        parts = [t for t in self._slots if t is not None]
        self._wait()
        return parts

    def _wait(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise CollectiveError("a rank of the in-process group did not arrive") from exc


class InProcessCommunicator(Communicator):
    def __init__(self, group: InProcessGroup, rank: int):
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.group.exchange(self.rank, x.clone())
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return x.copy_(total)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.group.exchange(self.rank, x), dim=-1)


class TorchDistributedCommunicator(Communicator):
    """This process's rank of a torch.distributed group (the default one, set up by
    `join_group`); failures of a peer surface as CollectiveError."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        self._guard(lambda: dist.all_reduce(x))
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._guard(lambda: dist.all_gather(parts, x))
        return torch.cat(parts, dim=-1)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def _guard(self, collective) -> None:
        try:
            collective()
        except (RuntimeError, ValueError) as exc:
            raise CollectiveError(f"rank {self.rank} of {self.world_size}: a collective failed: {exc}") from exc


def join_group(store, rank: int, world_size: int, device: torch.device, timeout_s: float) -> TorchDistributedCommunicator:
    """Join the ranks meeting at `store` (a torch.distributed Store): gloo on the CPU, NCCL on CUDA."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    return TorchDistributedCommunicator(rank, world_size)
