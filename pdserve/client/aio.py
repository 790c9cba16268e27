"""The asyncio client (grpc.aio): the same methods as Client, as coroutines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from pdserve.client.calls import AsyncStream
from pdserve.client.options import ClientOptions
from pdserve.client.types import Completion, Message
from pdserve.client.wire import (abort_outcome, abort_request, error_of, generation_stub, health_request, health_stub, is_serving,
                                 request_of)


class AsyncClient:
    def __init__(self, target: str, options: ClientOptions = ClientOptions()):
        self.options = options
        credentials = options.credentials()
        self._channel = (grpc.aio.secure_channel(target, credentials, options.channel_options()) if credentials
                         else grpc.aio.insecure_channel(target, options.channel_options()))
        self._stub = generation_stub(self._channel)

    def stream(self, prompt: str | None = None, *, messages: Sequence[Message | Mapping] | None = None,
               token_ids: Sequence[int] | None = None, priority: str | None = None, request_id: str | None = None,
               timeout_s: float | None = None, **sampling) -> AsyncStream:
        """As Client.stream: the request is sent at once (call it on the running loop)."""
        request = request_of(prompt, messages, token_ids, priority, request_id, sampling)
        return AsyncStream(self._stub.Generate(request, timeout=self.options.deadline(timeout_s),
                                               metadata=self.options.metadata()))

    async def generate(self, prompt: str | None = None, **kwargs) -> Completion:
        return await self.stream(prompt, **kwargs).collect()

    async def abort(self, request_id: str) -> bool:
        """Whether a running request of that id was found (and is now aborted)."""
        return (await self._abort(request_id)).found

    async def abort_outcome(self, request_id: str) -> str:
        """Aborts and says which case it was: "aborted", "pending" (the router had not seen the
        request yet: it ends with abort when it arrives) or "ended"."""
        return abort_outcome(await self._abort(request_id))

    async def _abort(self, request_id: str):
        try:
            return await self._stub.Abort(abort_request(request_id), timeout=self.options.timeout_s,
                                          metadata=self.options.metadata())
        except grpc.RpcError as exc:
            raise error_of(exc) from None

    async def health(self, service: str = "") -> bool:
        try:
            response = await health_stub(self._channel).Check(
                health_request(service), timeout=self.options.timeout_s or 10)
        except grpc.RpcError as exc:
            raise error_of(exc) from None
        return is_serving(response)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
