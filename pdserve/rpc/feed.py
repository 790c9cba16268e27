"""A worker's event feed on the wire (worker.proto EventBatch): a batch of its requests' events as
messages, each within a token budget far below the message size limit.

Where the router asked for token runs (EventsRequest.token_runs), a request whose first event in
the batch is a plain token event (ids alone) sends it packed beside the others' (one id list, one
length list, one token list per message: the router reads them with three accessors, not several
per event); its other events follow as FedEvents, which a reader takes after the runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from pdserve.v1 import worker_pb2 as wpb

MESSAGE_TOKENS = 1 << 16  # a message holds more only for one request's joined tokens


RunOf = Callable[[object], "Sequence[int] | None"]  # an event's token ids where it may go as a run, else None


def fed_batches_to_pb(batch: Mapping[str, Sequence[object]], to_pb: Callable[[object], wpb.DecodeEvent],
                      run_of: RunOf | None = None) -> Iterator[wpb.EventBatch]:
    """`batch` (request id -> its events, in order) as EventBatch messages: one, unless it holds
    more than MESSAGE_TOKENS tokens; a request's events stay in order across them. `run_of` (where
    the router asked for runs): a request's first event packed where it gives its ids."""
    message, tokens = _Message(), 0
    for request_id, events in batch.items():
        for i, event in enumerate(events):
            size = len(getattr(event, "token_ids", ()))
            if tokens and tokens + size > MESSAGE_TOKENS:
                yield message.pb()
                message, tokens = _Message(), 0
            if i == 0 and run_of is not None and (ids := run_of(event)) is not None:
                message.run(request_id, ids)
            else:
                message.events.append(wpb.FedEvent(request_id=request_id, event=to_pb(event)))
            tokens += size
    if message.events or message.run_ids:
        yield message.pb()


class _Message:
    """One EventBatch being filled: its runs kept as lists until it is built."""

    def __init__(self) -> None:
        self.events: list[wpb.FedEvent] = []
        self.run_ids: list[str] = []
        self.run_lengths: list[int] = []
        self.run_tokens: list[int] = []

    def run(self, request_id: str, token_ids: Sequence[int]) -> None:
        self.run_ids.append(request_id)
        self.run_lengths.append(len(token_ids))
        self.run_tokens.extend(token_ids)

    def pb(self) -> wpb.EventBatch:
        return wpb.EventBatch(events=self.events, run_request_ids=self.run_ids, run_lengths=self.run_lengths,
                              run_token_ids=self.run_tokens)
