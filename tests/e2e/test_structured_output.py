"""Structured output through the real service, by clients nobody here wrote: the openai SDK
(sync, async, streaming) with OpenAI's response_format and vLLM's extra fields, grpcurl with the
public proto's structured_output, and pdserve's own client. The first token is sampled on the
prefill worker, the rest on the decode worker: every output obeys its constraint whole, a bad
constraint is refused with a message, and both workers end holding no block."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest

from pdserve.client import PdserveError
from pdserve.requests import Constraint, ConstraintKind
from tests.helpers.grpcurl import grpcurl
from tests.helpers.worker_stats import wait_no_active_blocks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# Held out: no other test names these. Bounded, so every output ends inside max_tokens.
RECIPE = {"type": "object", "properties": {
    "dish": {"type": "string", "maxLength": 24},
    "servings": {"type": "integer", "minimum": 1, "maximum": 12},
    "vegetarian": {"type": "boolean"},
    "steps": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 3}},
    "required": ["dish", "servings", "vegetarian", "steps"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Give me a simple recipe."}]
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "recipe", "schema": RECIPE, "strict": True}}


def _recipe(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, RECIPE)
    return value


def test_sampled_chats_under_a_schema_all_validate_sync_async_and_streamed(service, sdk, model):
    reply = sdk.chat.completions.create(model=model, messages=ASK, max_tokens=160, temperature=0.7,
                                        response_format=RESPONSE_FORMAT)
    _recipe(reply.choices[0].message.content)
    assert reply.choices[0].finish_reason == "stop"

    async def many() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{service['http']}/v1", api_key="unused", max_retries=0,
                                      timeout=300) as client:
            replies = await asyncio.gather(*(client.chat.completions.create(
                model=model, messages=ASK, max_tokens=160, temperature=0.7, seed=i, response_format=RESPONSE_FORMAT)
                for i in range(12)))
        return [r.choices[0].message.content for r in replies]

    texts = asyncio.run(many())
    assert [_recipe(t) for t in texts] and len(set(texts)) > 1
    chunks = sdk.chat.completions.create(model=model, messages=ASK, max_tokens=160, temperature=0.7, stream=True,
                                         response_format=RESPONSE_FORMAT)
    _recipe("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    wait_no_active_blocks({"prefill": service["prefill"], "decode": service["decode"]})


def test_vllm_fields_constrain_completions_and_chats(sdk, model):
    answer = sdk.completions.create(model=model, prompt="Is the sea salty? Answer:", max_tokens=8, temperature=0.9,
                                    extra_body={"guided_choice": [" yes", " no"]})
    assert answer.choices[0].text in (" yes", " no")
    date = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "A date, please."}],
                                       max_tokens=20, temperature=0.9,
                                       extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"}})
    assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", date.choices[0].message.content)
    anything = sdk.chat.completions.create(model=model, messages=ASK, max_tokens=120, temperature=0,
                                           response_format={"type": "json_object"})
    content = anything.choices[0].message.content
    assert anything.choices[0].finish_reason == "length" or isinstance(json.loads(content), dict)


def test_a_bad_constraint_is_a_400_naming_it_and_the_service_goes_on(sdk, model):
    with pytest.raises(openai.BadRequestError, match="regex"):
        sdk.chat.completions.create(model=model, messages=ASK, max_tokens=8,
                                    extra_body={"structured_outputs": {"regex": "(unclosed"}})
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        sdk.chat.completions.create(model=model, messages=ASK, max_tokens=8, response_format={"type": "json_object"},
                                    extra_body={"ignore_eos": True})
    assert sdk.chat.completions.create(model=model, messages=ASK, max_tokens=4).choices[0].message.content


def test_grpcurl_and_the_python_client_set_structured_output(service, client):
    cli = grpcurl(service["target"])
    request = {"messages": {"messages": ASK}, "sampling": {"max_tokens": 160, "temperature": 0.7,
                                                           "structured_output": {"json_schema": json.dumps(RECIPE)}}}
    result = cli.run("pdserve.v1.Generation/Generate", data=request)
    assert result.returncode == 0, result.stderr
    _recipe("".join(m.get("text", "") for m in result.messages()))
    plate = client.generate(messages=ASK, max_tokens=12, temperature=0.8,
                            constraint=Constraint(ConstraintKind.REGEX, "[A-Z]{2}-[0-9]{4}"))
    assert re.fullmatch("[A-Z]{2}-[0-9]{4}", plate.text) and plate.finish_reason == "stop"
    with pytest.raises(PdserveError, match="INVALID_ARGUMENT"):
        client.generate(messages=ASK, max_tokens=4, constraint=Constraint(ConstraintKind.GRAMMAR, "start: nowhere"))
