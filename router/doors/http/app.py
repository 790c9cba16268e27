"""The OpenAI-compatible HTTP door: aiohttp on the router's event loop, in front of the same
gateway as the gRPC door.

    POST /v1/chat/completions   POST /v1/completions   (stream: server-sent events, then [DONE]; each
                                event's id `<request id>/<tokens sent>`: POSTed again with it as
                                Last-Event-ID, the stream goes on after it, at any router)
    GET  /v1/models             GET  /health, /ready   200 while a prefill and a decode worker pair, else 503
                                GET  /live            200 while the process answers (a liveness probe)
    POST /tokenize              POST /detokenize         GET /version   (router/doors/http/tokens.py)
    GET  /metrics               the router's Prometheus metrics (as on --metrics-port), as vLLM serves them

A client that disconnects cancels its handler (aiohttp's handler cancellation), which cancels
the request in the flow and frees its blocks, as a cancelled gRPC call does.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from pdserve.errors import InvalidRequestError
from pdserve.telemetry import EXPOSITION_CONTENT_TYPE
from router.doors.asks import Output, TextPrompt
from router.doors.gateway import Gateway
from router.doors.http.errors import BodyTooLarge, ModelNotFound, error_of, error_response
from router.doors.http.events import EventStream
from router.doors.http.openai_requests import OpenAIRequest, ParsedAsk, chat_request, completion_request
from router.doors.http.openai_responses import Reply
from router.doors.http.prompt_list import admit_rest, merged
from router.doors.http.tokens import TokenRoutes, server_version
from router.doors.limits import InputLimits

FORWARDED_HEADERS = ("authorization", "traceparent", "tracestate")  # become the gateway's metadata
PARSE_OFF_LOOP_BYTES = 1 << 20


def max_body_bytes(limits: InputLimits) -> int:
    """Room for a prompt at its limit in JSON with every character escaped (\\uXXXX), and the rest."""
    return 6 * limits.max_prompt_chars + (1 << 20)


@dataclass(frozen=True)
class HttpSettings:
    model: str  # the served model name (--served-model-name)
    max_context: int
    max_body_bytes: int
    # A stream whose first output has not come by then (a long prompt's prefill, a queue, a stream
    # continued at another router) gets its headers, then an SSE comment every `ping_s`: a silent
    # connection is what proxies and clients' read timeouts cut. Before it a failure still gets its status.
    headers_after_s: float = 5.0
    ping_s: float = 15.0


class HttpApi:
    def __init__(self, gateway: Gateway, settings: HttpSettings, token_text: Callable[[int], str],
                 serving: Callable[[], bool], exposition: Callable[[], bytes]):
        """`exposition`: the router's metrics in Prometheus text format (Metrics.exposition)."""
        self.gateway = gateway
        self.settings = settings
        self.token_text = token_text
        self.serving = serving
        self.exposition = exposition
        self.tokens = TokenRoutes(gateway.frontend, settings.model, settings.max_context)

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.add_routes([web.post("/v1/chat/completions", self.chat_completions),
                        web.post("/v1/completions", self.completions),
                        web.get("/v1/models", self.models), web.get("/health", self.health),
                        web.get("/ready", self.health), web.get("/live", self.live),
                        web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize),
                        web.get("/version", self.version), web.get("/metrics", self.metrics)])
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.exposition(), headers={"Content-Type": EXPOSITION_CONTENT_TYPE})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await self.tokens.tokenize(await self._body(request)))
        except Exception as exc:
            return error_response(exc)

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self.tokens.detokenize(await self._body(request)))
        except Exception as exc:
            return error_response(exc)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(server_version())

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat_request)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, completion_request)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.settings.model, "object": "model", "created": 0, "owned_by": "pdserve",
            "max_model_len": self.settings.max_context}]})

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def health(self, request: web.Request) -> web.Response:
        if self.serving():
            return web.json_response({"status": "serving"})
        return web.json_response({"status": "not serving"}, status=503)

    async def _generate(self, request: web.Request, parse) -> web.StreamResponse:
        try:
            body = await self._body(request)
            source = ParsedAsk(lambda: self._checked(parse(body, request.headers, self.settings.model)))
            first = ParsedAsk(lambda: source.parsed().each()[0])  # (a list of prompts: one request each)
            generation = await self.gateway.admit(_metadata(request), first, None)
            openai = source.parsed()
            generations = await admit_rest(self.gateway, _metadata(request), generation, openai.each()[1:])
        except Exception as exc:
            return error_response(exc)
        reply = Reply(generation.request_id, openai.model, openai.chat, self.token_text, openai.logprobs,
                      tools=openai.tools.names if openai.tools else None, echo=self._echo(openai),
                      echo_first=generation.job.prompt[0] if openai.echo else None,
                      samples_per_prompt=openai.ask.count.n)
        outputs = self.gateway.stream(generation) if len(generations) == 1 else \
            merged(self.gateway, generations, openai.ask.count.n)
        traced = dict(generation.trace.metadata())  # W3C trace context out: the request's root span
        if openai.stream:
            ids = EventIds(generation.request_id, openai.ask.resume.from_token if openai.ask.resume else 0)
            return await self._stream(request, outputs, reply, openai.include_usage, traced, ids)
        try:
            whole = [output async for output in outputs]
        except Exception as exc:
            return error_response(exc)
        return web.json_response(reply.whole(whole), headers=traced)

    async def _stream(self, request: web.Request, outputs: AsyncIterator[Output], reply: Reply,
                      include_usage: bool, headers: dict[str, str], ids: EventIds) -> web.StreamResponse:
        """The headers go out with the first output, or `headers_after_s` without one: a request
        refused or failed before then (an admission's 429 with Retry-After) is answered with its
        status, as a whole response is; after, its error is the stream's last event. The outputs
        are read in this task (the gateway counts the request as running while it lives)."""
        events = EventStream(headers=headers, allow_all_methods=True,  # POST, as OpenAI streams
                             ping_interval=self.settings.ping_s)
        opener = _Opener(request, events, self.settings.headers_after_s)
        try:
            first_output, failure = None, None
            try:
                first_output = await opener.first(outputs)
            except Exception as exc:
                if not events.prepared:
                    return error_response(exc)
                failure = exc
            await events.prepare(request)
            async with events:
                try:
                    if failure is not None:
                        raise failure
                    if first_output is not None:
                        await events.send(json.dumps(reply.chunk(first_output)), id=ids.after(first_output))
                    async for output in outputs:
                        await events.send(json.dumps(reply.chunk(output)), id=ids.after(output))
                    if include_usage:
                        await events.send(json.dumps(reply.usage_chunk()), id=ids.now)
                except Exception as exc:  # the headers are out: the error is the stream's last event
                    await events.send(json.dumps(error_of(exc)[1]), id=ids.now)
                await events.send("[DONE]", id=ids.now)
            return events
        finally:
            if events.prepared:  # (the client left while its headers were out: no pings after it)
                events.stop_streaming()
            await outputs.aclose()

    def _echo(self, openai: OpenAIRequest) -> str:
        """A completion's prompt as text, for echo (a prompt of token ids decoded)."""
        if not openai.echo:
            return ""
        prompt = openai.ask.prompt
        if isinstance(prompt, TextPrompt):
            return prompt.text
        return self.gateway.frontend.tokenizer.decode(prompt.ids, skip_special_tokens=False)

    def _checked(self, openai: OpenAIRequest) -> OpenAIRequest:
        if openai.model != self.settings.model:
            raise ModelNotFound(f"the model {openai.model[:64]!r} does not exist; this server serves "
                                f"{self.settings.model!r}")
        return openai

    async def _body(self, request: web.Request) -> dict:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"the body is over {self.settings.max_body_bytes} bytes (the prompt limit, "
                               "--max-prompt-chars, sets it)") from None
        try:
            if len(raw) > PARSE_OFF_LOOP_BYTES:
                body = await asyncio.get_running_loop().run_in_executor(None, json.loads, raw)
            else:
                body = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidRequestError("the body must be a JSON object")
        return body


class EventIds:
    """Each event's SSE id: `<request id>/<tokens the client has after it>`, what Last-Event-ID
    sends back to continue after it."""

    def __init__(self, request_id: str, tokens: int):
        self.request_id = request_id
        self.tokens = tokens

    def after(self, output: Output) -> str:
        self.tokens += len(output.token_ids)
        return self.now

    @property
    def now(self) -> str:
        return f"{self.request_id}/{self.tokens}"


class _Opener:
    """Sends a stream's headers (and from then its pings) once `after_s` passed without its first
    output, from a task of its own while the handler's task waits for that output."""

    def __init__(self, request: web.Request, events: EventStream, after_s: float):
        self._request, self._events, self._after_s = request, events, after_s
        self._opening = False

    async def first(self, outputs: AsyncIterator[Output]) -> Output | None:
        """The first output (None: the stream ended without one)."""
        task = asyncio.ensure_future(self._open())
        try:
            return await anext(outputs)
        except StopAsyncIteration:
            return None
        finally:
            if not self._opening:  # still waiting: nothing written
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _open(self) -> None:
        await asyncio.sleep(self._after_s)
        self._opening = True
        await self._events.prepare(self._request)


def _metadata(request: web.Request) -> tuple[tuple[str, str], ...]:
    return tuple((name, request.headers[name]) for name in FORWARDED_HEADERS if name in request.headers)


@dataclass
class HttpServer:
    runner: web.AppRunner
    port: int

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_http(api: HttpApi, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> HttpServer:
    runner = web.AppRunner(api.application(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    bound = runner.addresses[0][1]
    return HttpServer(runner, bound)
