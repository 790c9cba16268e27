"""KV block transfer between workers (data plane): UCX and in-process transports, one interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdserve.transfer.base import (
    CancelResult,
    KVReceiver,
    KVSender,
    KVTransport,
    TransferCancelled,
    TransferError,
    TransferRejected,
    TransferResult,
    TransferTimeout,
    TransferUnreachable,
    settled_all,
)
from pdserve.transfer.descriptors import BlockRun, merge_runs
from pdserve.transfer.inprocess import InProcessFabric, InProcessTransport

if TYPE_CHECKING:
    from pdserve.transfer.ucx import UcxConfig

TRANSPORTS = ("ucx", "inprocess")


def make_transport(
    name: str, *, fabric: InProcessFabric | None = None, ucx: "UcxConfig | None" = None
) -> KVTransport:
    """"ucx": ucxx between processes (ucxx imported when the first end is built);
    "inprocess": torch copies between pools meeting in `fabric` (required, shared by both sides)."""
    if name == "inprocess":
        if fabric is None:
            raise ValueError("the in-process transport needs the fabric both sides share")
        return InProcessTransport(fabric)
    if name == "ucx":
        from pdserve.transfer.ucx import UcxConfig, UcxTransport

        return UcxTransport(ucx if ucx is not None else UcxConfig())
    raise ValueError(f"unknown transport {name!r}; one of {TRANSPORTS}")


__all__ = [
    "BlockRun",
    "CancelResult",
    "InProcessFabric",
    "KVReceiver",
    "KVSender",
    "KVTransport",
    "TRANSPORTS",
    "TransferCancelled",
    "TransferError",
    "TransferRejected",
    "TransferResult",
    "TransferTimeout",
    "TransferUnreachable",
    "make_transport",
    "merge_runs",
    "settled_all",
]
