"""A request's owner and an Abort's scope on the internal wire (worker.proto), both ways."""

from __future__ import annotations

from pdserve.aborts import AbortScope, Owner
from pdserve.rpc.bounds import check_id
from pdserve.v1 import worker_pb2 as wpb

_SCOPE_TO_PB = {AbortScope.LIVE: wpb.ABORT_SCOPE_LIVE, AbortScope.REMEMBER: wpb.ABORT_SCOPE_REMEMBER,
                AbortScope.FORGET: wpb.ABORT_SCOPE_FORGET}
_SCOPE_FROM_PB = {v: k for k, v in _SCOPE_TO_PB.items()}


def owner_to_pb(owner: Owner) -> wpb.RequestOwner:
    return wpb.RequestOwner(tenant=owner.tenant, request_id=owner.request_id)


def owner_of(message: wpb.WorkerRequest | wpb.WorkerAbortRequest | wpb.FindRequest | wpb.AttachRequest) -> Owner | None:
    """The message's owner (None: unset); its id checked as every internal id is."""
    if not message.HasField("owner"):
        return None
    return Owner(message.owner.tenant, check_id("owner.request_id", message.owner.request_id))


def scope_to_pb(scope: AbortScope) -> int:
    return _SCOPE_TO_PB[scope]


def scope_from_pb(value: int) -> AbortScope:
    """Unspecified (or unknown): LIVE, the scope that remembers nothing."""
    return _SCOPE_FROM_PB.get(value, AbortScope.LIVE)
