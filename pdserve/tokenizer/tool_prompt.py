"""Functions a model may call, for a chat template with no tool section of its own (the embedded
SmolLM2's): the functions stated in a system message, with the one format the model is asked to
answer in, and the conversation's earlier calls and results written in that same format:

    system     (the caller's system text, then) the functions as JSON and TOOL_CALL_FORMAT
    assistant  its text, then one <tool_call>{"name": ..., "arguments": {...}}</tool_call> a call
    tool       (a function's result, with its tool_call_id) a user turn:
               <tool_response>{"tool_call_id": ..., "content": ...}</tool_response>

It is the format Hermes- and Qwen-style templates use, so the router reads every model's calls
one way (router/doors/http/tool_calls.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from pdserve.tokenizer.base import ChatMessage, MessageLike, Tools

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_CALL_FORMAT = (
    "To call a function, answer with one line per call and nothing else:\n"
    f'{TOOL_CALL_OPEN}{{"name": <function name>, "arguments": <arguments as a JSON object>}}{TOOL_CALL_CLOSE}\n'
    "Otherwise answer normally.")


def tool_system_text(tools: Tools) -> str:
    listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return f"You can call these functions:\n{listed}\n{TOOL_CALL_FORMAT}"


def call_text(name: str, arguments: str) -> str:
    """One call as the model is asked to write it (`arguments`: a JSON object's text)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        value = arguments
    call = json.dumps({"name": name, "arguments": value}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{call}{TOOL_CALL_CLOSE}"


def plain_messages(messages: Sequence[MessageLike], tools: Tools) -> list[ChatMessage | Mapping]:
    """The conversation for a template without a tool section: the functions in the (first)
    system message, calls and results as text in the format above."""
    out: list[ChatMessage | Mapping] = [_plain(m) for m in messages]
    if not tools:
        return out
    text = tool_system_text(tools)
    first = out[0] if out else None
    if isinstance(first, ChatMessage) and first.role == "system":
        out[0] = ChatMessage("system", f"{first.content}\n\n{text}")
    else:
        out.insert(0, ChatMessage("system", text))
    return out


def _plain(message: MessageLike) -> ChatMessage | Mapping:
    if not isinstance(message, ChatMessage):
        return message
    if message.role == "tool" and message.tool_call_id is not None:  # a function's result
        result = json.dumps({"tool_call_id": message.tool_call_id, "content": message.content}, ensure_ascii=False)
        return ChatMessage("user", f"<tool_response>{result}</tool_response>")
    if message.tool_calls:
        calls = "\n".join(call_text(c.name, c.arguments) for c in message.tool_calls)
        return ChatMessage(message.role, f"{message.content}\n{calls}" if message.content else calls)
    return message
