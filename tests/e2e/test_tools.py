"""Tools through the real service with the openai SDK (sync, async, streaming): a named or
required tool_choice yields calls whose arguments the function's schema accepts (their grammar
constrains the output, the first token on the prefill worker), streamed as the SDK assembles
them; a call's result sent back is answered in text; bad tool fields are 400s naming them."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# Held out: no other test names it.
CONVERT = {"type": "function", "function": {
    "name": "convert_currency", "description": "Convert an amount of money between currencies",
    "parameters": {"type": "object", "properties": {
        "amount": {"type": "number"}, "source": {"enum": ["EUR", "USD", "JPY"]},
        "target": {"enum": ["EUR", "USD", "JPY"]}}, "required": ["amount", "source", "target"],
        "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "local_time", "description": "The time in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
    "additionalProperties": False}}}  # (without it, JSON Schema lets a call add keys: bounded by max_tokens only)
ASK = [{"role": "user", "content": "How many yen is 20 euros?"}]
NAMED = {"type": "function", "function": {"name": "convert_currency"}}


def _valid(call, tools=(CONVERT, TIME)) -> str:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)
    return call.function.name


def test_a_named_function_is_called_with_arguments_its_schema_accepts(sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=ASK, tools=[CONVERT, TIME], tool_choice=NAMED,
                                        max_tokens=80, temperature=0.7)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [_valid(c) for c in choice.message.tool_calls] == ["convert_currency"]
    assert choice.message.tool_calls[0].id and choice.message.tool_calls[0].type == "function"


def test_required_calls_stream_as_the_sdk_assembles_them(service, sdk, model):
    stream = sdk.chat.completions.create(model=model, messages=ASK, tools=[CONVERT, TIME], tool_choice="required",
                                         parallel_tool_calls=False, max_tokens=80, temperature=0, stream=True)
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
    assert reasons[-1] == "tool_calls" and len(calls) == 1
    call = calls[0]
    schema = {"convert_currency": CONVERT, "local_time": TIME}[call["name"]]["function"]["parameters"]
    jsonschema.validate(json.loads(call["arguments"]), schema)
    wait_no_active_blocks({"prefill": service["prefill"], "decode": service["decode"]})


def test_sampled_calls_from_the_async_client_all_validate(service, model):
    async def many():
        async with openai.AsyncOpenAI(base_url=f"{service['http']}/v1", api_key="unused", max_retries=0,
                                      timeout=300) as client:
            return await asyncio.gather(*(client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"What time is it in city number {i}?"}],
                tools=[TIME], tool_choice="required", parallel_tool_calls=False, max_tokens=60, temperature=0.8,
                seed=i) for i in range(6)))

    for reply in asyncio.run(many()):
        assert reply.choices[0].message.tool_calls, (reply.choices[0].finish_reason, reply.choices[0].message.content)
        assert [_valid(c) for c in reply.choices[0].message.tool_calls] == ["local_time"]


def test_a_result_sent_back_is_answered_in_text(sdk, model):
    call = sdk.chat.completions.create(model=model, messages=ASK, tools=[CONVERT], tool_choice=NAMED, max_tokens=80,
                                       temperature=0).choices[0].message.tool_calls[0]
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "3300 JPY"}]
    answer = sdk.chat.completions.create(model=model, messages=follow, tools=[CONVERT], tool_choice="none",
                                         max_tokens=24, temperature=0)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


@pytest.mark.parametrize(("fields", "needle"), [
    ({"tools": [CONVERT], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "name"),
    ({"tool_choice": "required"}, "needs tools"),
])
def test_bad_tool_fields_are_400s_naming_them(sdk, model, fields, needle):
    with pytest.raises(openai.BadRequestError, match=needle):
        sdk.chat.completions.create(model=model, messages=ASK, max_tokens=8, **fields)
