"""A typed Python client of pdserve's public gRPC API, sync and asyncio.

    from pdserve.client import Client

    with Client("127.0.0.1:50051") as client:
        answer = client.generate(messages=[{"role": "user", "content": "Hi!"}], max_tokens=20, temperature=0)
        print(answer.text, answer.finish_reason, answer.usage.completion_tokens, answer.timings.ttft_s)
        for chunk in client.stream("Once upon a time", max_tokens=40):
            print(chunk.text, end="", flush=True)

`stream` sends the request at once and returns a `Stream` of chunks that can also be cancelled
(pdserve.client.calls). `AsyncClient` has the same methods as coroutines, but `stream`, which
returns an `AsyncStream` (an async iterator). Errors are `PdserveError` with the gRPC status
name and the server's message.
"""

from pdserve.client.aio import AsyncClient
from pdserve.client.calls import AsyncStream, Stream
from pdserve.client.options import ClientOptions
from pdserve.client.sync import Client
from pdserve.client.types import Chunk, Completion, Message, PdserveError, Timings, TokenLogprobs, Usage

__all__ = ["AsyncClient", "AsyncStream", "Chunk", "Client", "ClientOptions", "Completion", "Message", "PdserveError",
           "Stream", "Timings", "TokenLogprobs", "Usage"]
