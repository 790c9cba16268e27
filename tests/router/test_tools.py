"""Tools in OpenAI chat bodies and calls read off outputs, without a server: the request's
functions and choice, its messages' calls and results, the grammar that forces calls, and the
calls found in a whole output or in one that streams (text that may begin a call held back)."""

from __future__ import annotations

import json

import pytest

from pdserve.errors import InvalidRequestError
from pdserve.grammar import check_constraint
from pdserve.tokenizer import ChatMessage, ToolCall, load_tokenizer
from router.doors.http.openai_requests import chat_request
from router.doors.http.tool_calls import StreamedCalls, parse

LOOKUP = {"type": "function", "function": {"name": "lookup_isbn", "description": "A book by its ISBN",
                                           "parameters": {"type": "object", "properties": {"isbn": {"type": "string"}},
                                                          "required": ["isbn"]}}}
CLOCK = {"type": "function", "function": {"name": "clock"}}
NAMES = frozenset({"lookup_isbn", "clock"})


def _chat(body):
    return chat_request({"messages": [{"role": "user", "content": "hi"}], **body}, {}, "m")


def test_auto_states_the_tools_and_constrains_nothing():
    request = _chat({"tools": [LOOKUP, CLOCK]})
    assert request.tools.names == NAMES and request.ask.sampling.constraint is None
    assert [t["function"]["name"] for t in request.ask.prompt.tools] == ["lookup_isbn", "clock"]
    assert request.ask.prompt.tools[1]["function"]["parameters"] == {"type": "object", "properties": {}}


def test_none_leaves_the_tools_out():
    request = _chat({"tools": [LOOKUP], "tool_choice": "none"})
    assert request.tools is None and request.ask.prompt.tools == ()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "lookup_isbn"}}])
def test_required_and_named_constrain_the_output_to_calls(choice):
    constraint = _chat({"tools": [LOOKUP, CLOCK], "tool_choice": choice}).ask.sampling.constraint
    check_constraint(constraint)
    assert "<tool_call>" in constraint.spec and "lookup_isbn" in constraint.spec
    assert ("clock" in constraint.spec) == (choice == "required")


def test_earlier_calls_and_results_become_messages():
    request = chat_request({"messages": [
        {"role": "user", "content": "Find 978-0."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup_isbn", "arguments": '{"isbn": "978-0"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Dune"}], "tools": [LOOKUP]}, {}, "m")
    assert request.ask.prompt.messages[1:] == [
        ChatMessage("assistant", "", (ToolCall("c1", "lookup_isbn", '{"isbn": "978-0"}'),)),
        ChatMessage("tool", "Dune", tool_call_id="c1")]


@pytest.mark.parametrize(("body", "needle"), [
    ({"tools": {"a": 1}}, "tools must be a list"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, r"tools\[0\].function.name"),
    ({"tools": [LOOKUP, LOOKUP]}, "twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "parameters"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": [LOOKUP], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "not among"),
    ({"tools": [LOOKUP], "tool_choice": "sometimes"}, "tool_choice must be"),
    ({"tools": [LOOKUP], "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot go with"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}]},
     r"tool_calls\[0\]"),
])
def test_malformed_tool_fields_are_refused_naming_them(body, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        _chat(body)


def test_calls_are_read_in_either_format_and_only_for_known_functions():
    tagged = parse('Sure.\n<tool_call>{"name": "lookup_isbn", "arguments": {"isbn": "1"}}</tool_call>', NAMES)
    assert tagged.content == "Sure." and [(c.name, json.loads(c.arguments)) for c in tagged.calls] == [
        ("lookup_isbn", {"isbn": "1"})]
    bare = parse('{"name": "clock", "parameters": {}}', NAMES)
    assert bare.content is None and [c.name for c in bare.calls] == ["clock"]
    assert parse('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', NAMES).calls == ()
    assert parse('{"a": 1}', NAMES).content == '{"a": 1}'
    assert parse("<tool_call>not json</tool_call>", NAMES).calls == ()


def test_streamed_text_holds_back_only_what_may_begin_a_call():
    calls = StreamedCalls(NAMES)
    out = [calls.feed(piece) for piece in ["The answer", " is <", "tool_", "call>", '{"name": "clock", ',
                                           '"arguments": {}}</tool_call>']]
    assert "".join(out) == "The answer is "
    end = calls.finish()
    assert end.content is None and [c.name for c in end.calls] == ["clock"]
    plain = StreamedCalls(NAMES)
    assert plain.feed("a < b") == "a < b" and plain.feed(" <t") == " " and plain.finish().content == "<t"


def test_a_template_without_a_tool_section_states_the_tools_in_a_system_message():
    tokenizer = load_tokenizer(None)
    text = tokenizer.render_chat([ChatMessage("system", "Be brief."), ChatMessage("user", "Book 1?")], True, [LOOKUP])
    assert text.count("<|im_start|>system") == 1 and "Be brief." in text and '"name": "lookup_isbn"' in text
    ids = tokenizer.apply_chat_template([ChatMessage("user", "Book 1?")], True, [LOOKUP])
    assert '"lookup_isbn"' in tokenizer.decode(ids)
