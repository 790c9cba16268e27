"""OpenAI's tools in a chat body: the functions (`tools`), whether and which to call
(`tool_choice`: "auto", "none", "required", or {"type": "function", "function": {"name"}}),
`parallel_tool_calls`, and the conversation's earlier calls (an assistant message's `tool_calls`)
and results (`role: tool` messages with their `tool_call_id`).

    auto      the functions are stated in the prompt (the model's template, or
              pdserve/tokenizer/tool_prompt.py); the model answers text or calls, and calls are
              read off its output (router/doors/http/tool_calls.py)
    none      the functions are left out of the prompt: the answer is text
    required  the output is constrained to calls (<tool_call>{"name", "arguments"}</tool_call>,
              one per line, at most MAX_PARALLEL_CALLS; one only without parallel_tool_calls) of
              any of the functions
    named     the output is one call of the named function
              Each call's arguments are what its function's parameters schema accepts (a Lark
              grammar whose calls are llguidance's %json rules).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pdserve.errors import InvalidRequestError
from pdserve.grammar.source import JSON_OPTIONS
from pdserve.requests import Constraint, ConstraintKind
from pdserve.tokenizer import ChatMessage, ToolCall
from pdserve.tokenizer.tool_prompt import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from router.doors.http.fields import Body

MAX_TOOLS = 128
MAX_PARALLEL_CALLS = 8  # calls one forced answer may hold (a small model may repeat a call until max_tokens)
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's function names
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolUse:
    """What a chat body asks of tools; None from `tool_use` when it names none or says "none"."""

    tools: tuple[dict, ...]  # as the prompt states them: {"type": "function", "function": {...}}
    names: frozenset[str]
    constraint: Constraint | None  # required or named: the calls' grammar


def tool_use(body: Body) -> ToolUse | None:
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice == "none":
        return None
    if not tools:
        raise InvalidRequestError("tool_choice needs tools")
    names = [t["function"]["name"] for t in tools]
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidRequestError("parallel_tool_calls must be true or false")
    if choice == "auto":
        return ToolUse(tools, frozenset(names), None)
    if choice == "required":
        return ToolUse(tools, frozenset(names), _calls_grammar(tools, parallel))
    named = _named(choice)
    if named not in names:
        raise InvalidRequestError(f"tool_choice names {named[:64]!r}, which is not among the tools")
    return ToolUse(tools, frozenset(names), _calls_grammar([t for t in tools if t["function"]["name"] == named],
                                                           parallel=False))


def tool_message(index: int, role: str, content: str, message: dict) -> ChatMessage:
    """A chat message with the tool fields OpenAI gives it (`content` already read)."""
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequestError(f"messages[{index}]: a tool message needs its tool_call_id")
        return ChatMessage("tool", content, tool_call_id=call_id)
    calls = message.get("tool_calls")
    if calls is None:
        return ChatMessage(role, content)
    if role != "assistant" or not isinstance(calls, list):
        raise InvalidRequestError(f"messages[{index}].tool_calls must be a list, on an assistant message")
    return ChatMessage(role, content, tuple(_call(index, i, c) for i, c in enumerate(calls)))


def _call(index: int, i: int, call) -> ToolCall:
    where = f"messages[{index}].tool_calls[{i}]"
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)):
        raise InvalidRequestError(f"{where} must be {{id, type: function, function: {{name, arguments}}}}")
    return ToolCall(str(call.get("id") or f"call_{index}_{i}"), function["name"], function["arguments"])


def _tools(value) -> tuple[dict, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise InvalidRequestError(f"tools must be a list of at most {MAX_TOOLS} functions")
    tools, seen = [], set()
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict):
            raise InvalidRequestError(f"tools[{i}] must be {{type: function, function: {{name, ...}}}}")
        name, parameters = function.get("name"), function.get("parameters", NO_PARAMETERS)
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            raise InvalidRequestError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -")
        if name in seen:
            raise InvalidRequestError(f"tools name the function {name!r} twice")
        if not isinstance(parameters, dict):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON schema object")
        seen.add(name)
        tools.append({"type": "function", "function": {**function, "parameters": parameters}})
    return tuple(tools)


def _named(choice) -> str:
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
        raise InvalidRequestError('tool_choice must be "auto", "none", "required" or '
                                  '{"type": "function", "function": {"name": ...}}')
    return function["name"]


def _calls_grammar(tools, parallel: bool) -> Constraint:
    """One call (or one per line, `parallel`) of any of `tools`, as a Lark grammar."""
    rules = [f"f{i}: %json {json.dumps(_call_schema(t['function']))}" for i, t in enumerate(tools)]
    alternatives = " | ".join(f"f{i}" for i in range(len(tools)))
    start = f'start: call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "start: call"
    call = f"call: {json.dumps(TOOL_CALL_OPEN)} ({alternatives}) {json.dumps(TOOL_CALL_CLOSE)}"
    return Constraint(ConstraintKind.GRAMMAR, "\n".join([start, call, *rules]))


def _call_schema(function: dict) -> dict:
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": function["parameters"]},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_OPTIONS}
