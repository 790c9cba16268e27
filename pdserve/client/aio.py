"""The asyncio client (grpc.aio): the same methods as Client, as coroutines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from pdserve.client.calls import AsyncStream, Tries
from pdserve.client.options import ClientOptions, targets_of
from pdserve.client.routing import Routing
from pdserve.client.types import Completion, Message
from pdserve.client.wire import (abort_outcome, abort_request, error_of, generation_stub, health_request, health_stub, is_serving,
                                 request_of)


class AsyncClient:
    def __init__(self, target: str | Sequence[str], options: ClientOptions = ClientOptions()):
        """As Client: one router, or several that a stream goes on at when its router goes away."""
        self.options = options
        credentials = options.credentials()
        self._channels = [grpc.aio.secure_channel(t, credentials, options.channel_options()) if credentials
                          else grpc.aio.insecure_channel(t, options.channel_options()) for t in targets_of(target)]
        self._routing = Routing([generation_stub(c) for c in self._channels], options)
        self._channel, self._stub = self._channels[0], self._routing.stubs[0]

    def stream(self, prompt: str | None = None, *, messages: Sequence[Message | Mapping] | None = None,
               token_ids: Sequence[int] | None = None, priority: str | None = None, request_id: str | None = None,
               timeout_s: float | None = None, resume_from_token: int | None = None,
               prior_token_ids: Sequence[int] = (), **sampling) -> AsyncStream:
        """As Client.stream: the request is sent at once (call it on the running loop)."""
        request = request_of(prompt, messages, token_ids, priority, request_id, sampling, resume_from_token,
                             prior_token_ids)
        return AsyncStream(Tries(*self._routing.calls(request, timeout_s)))

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
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
