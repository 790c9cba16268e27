"""The blocking client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from pdserve.client.calls import Stream
from pdserve.client.options import ClientOptions
from pdserve.client.types import Completion, Message
from pdserve.client.wire import (abort_outcome, abort_request, error_of, generation_stub, health_request, health_stub, is_serving,
                                 request_of)


class Client:
    def __init__(self, target: str, options: ClientOptions = ClientOptions()):
        self.options = options
        credentials = options.credentials()
        self._channel = (grpc.secure_channel(target, credentials, options.channel_options()) if credentials
                         else grpc.insecure_channel(target, options.channel_options()))
        self._stub = generation_stub(self._channel)

    def stream(self, prompt: str | None = None, *, messages: Sequence[Message | Mapping] | None = None,
               token_ids: Sequence[int] | None = None, priority: str | None = None, request_id: str | None = None,
               timeout_s: float | None = None, **sampling) -> Stream:
        """Sends the request now; the Stream yields its chunks as the server sends them (see
        pdserve.client.calls). `timeout_s`: this call's deadline, instead of the options' one."""
        request = request_of(prompt, messages, token_ids, priority, request_id, sampling)
        return Stream(self._stub.Generate(request, timeout=self.options.deadline(timeout_s),
                                          metadata=self.options.metadata()))

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
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
