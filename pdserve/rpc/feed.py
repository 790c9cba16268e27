"""A worker's event feed on the wire (worker.proto EventBatch): a batch of its requests' events as
messages, each within a token budget far below the message size limit."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from pdserve.v1 import worker_pb2 as wpb

MESSAGE_TOKENS = 1 << 16  # a message holds more only for one request's joined tokens


def fed_batches_to_pb(batch: Mapping[str, Sequence[object]],
                      to_pb: Callable[[object], wpb.DecodeEvent]) -> Iterator[wpb.EventBatch]:
    """`batch` (request id -> its events, in order) as EventBatch messages: one, unless it holds
    more than MESSAGE_TOKENS tokens; a request's events stay in order across them."""
    message, tokens = wpb.EventBatch(), 0
    for request_id, events in batch.items():
        for event in events:
            size = len(getattr(event, "token_ids", ()))
            if tokens and tokens + size > MESSAGE_TOKENS:
                yield message
                message, tokens = wpb.EventBatch(), 0
            message.events.append(wpb.FedEvent(request_id=request_id, event=to_pb(event)))
            tokens += size
    if message.events:
        yield message
