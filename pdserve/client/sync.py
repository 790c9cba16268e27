"""The blocking client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from pdserve.client.calls import Stream, Tries
from pdserve.client.options import ClientOptions, targets_of
from pdserve.client.routing import Routing
from pdserve.client.types import Completion, Message
from pdserve.client.wire import (abort_outcome, abort_request, error_of, generation_stub, health_request, health_stub, is_serving,
                                 request_of)


class Client:
    def __init__(self, target: str | Sequence[str], options: ClientOptions = ClientOptions()):
        """`target`: a router's host:port, or several (a list, or comma-separated): a stream whose
        router goes away then goes on at the next one (pdserve.client.calls)."""
        self.options = options
        credentials = options.credentials()
        self._channels = [grpc.secure_channel(t, credentials, options.channel_options()) if credentials
                          else grpc.insecure_channel(t, options.channel_options()) for t in targets_of(target)]
        self._routing = Routing([generation_stub(c) for c in self._channels], options)
        self._channel, self._stub = self._channels[0], self._routing.stubs[0]

    def stream(self, prompt: str | None = None, *, messages: Sequence[Message | Mapping] | None = None,
               token_ids: Sequence[int] | None = None, priority: str | None = None, request_id: str | None = None,
               timeout_s: float | None = None, resume_from_token: int | None = None,
               prior_token_ids: Sequence[int] = (), **sampling) -> Stream:
        """Sends the request now; the Stream yields its chunks as the server sends them (see
        pdserve.client.calls). `timeout_s`: this call's deadline, instead of the options' one.
        `resume_from_token`: continue the request `request_id` (the same arguments) after as many of
        its tokens, `prior_token_ids` when the caller has them (a client given several routers does
        this itself when a stream's router goes away)."""
        request = request_of(prompt, messages, token_ids, priority, request_id, sampling, resume_from_token,
                             prior_token_ids)
        return Stream(Tries(*self._routing.calls(request, timeout_s)))

    def generate(self, prompt: str | None = None, **kwargs) -> Completion:
        """The whole answer, with what the client saw of its timing (`stream`'s arguments)."""
        return self.stream(prompt, **kwargs).collect()

    def abort(self, request_id: str) -> bool:
        """Whether a running request of that id was found (and is now aborted)."""
        return self._abort(request_id).found

    def abort_outcome(self, request_id: str) -> str:
        """Aborts and says which case it was: "aborted", "pending" (the router had not seen the
        request yet: it ends with abort when it arrives) or "ended"."""
        return abort_outcome(self._abort(request_id))

    def _abort(self, request_id: str):
        try:
            return self._stub.Abort(abort_request(request_id), timeout=self.options.timeout_s,
                                    metadata=self.options.metadata())
        except grpc.RpcError as exc:
            raise error_of(exc) from None

    def health(self, service: str = "") -> bool:
        """Whether the router says SERVING."""
        try:
            response = health_stub(self._channel).Check(health_request(service), timeout=self.options.timeout_s or 10)
        except grpc.RpcError as exc:
            raise error_of(exc) from None
        return is_serving(response)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
