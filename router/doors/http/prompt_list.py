"""A completion with a list of prompts: one gateway request per prompt, their outputs as one
OpenAI answer whose choice `index` is prompt * n + sample (as OpenAI numbers them).

    admit_rest(...)   admits the prompts after the first (whose admission the door did); a
                      refusal of one ends the ones already admitted and raises
    merged(...)       every request's outputs as they come, indices offset; closing it (or a
                      failure of one) cancels every request still running
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from router.doors.asks import Output
from router.doors.gateway import Gateway, Generation
from router.doors.http.openai_requests import OpenAIRequest, ParsedAsk

Metadata = tuple[tuple[str, str], ...]
_END = object()


async def admit_rest(gateway: Gateway, metadata: Metadata, first: Generation,
                     rest: Sequence[OpenAIRequest]) -> list[Generation]:
    admitted = [first]
    try:
        for request in rest:
            admitted.append(await gateway.admit(metadata, ParsedAsk(lambda r=request: r), None))
    except Exception as exc:
        for generation in admitted:
            generation.trace.fail(exc, "CANCELLED")
        raise
    return admitted


async def merged(gateway: Gateway, generations: Sequence[Generation], per_prompt: int) -> AsyncIterator[Output]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(prompt: int, generation: Generation) -> None:
        try:
            async for output in gateway.stream(generation):
                queue.put_nowait(dataclasses.replace(output, index=prompt * per_prompt + output.index))
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(_END)

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generations)]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
