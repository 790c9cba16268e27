"""Chat template rendering: variables, sandboxing, and clear errors."""

from __future__ import annotations


import pytest

from pdserve.tokenizer import ChatMessage, ChatTemplateError
from pdserve.tokenizer.chat_template import ChatTemplate
from pdserve.tokenizer.fast import FastTokenizer, SpecialTokens

STRICT = (
    "{% for m in messages %}"
    "{% if m['role'] not in ('system', 'user', 'assistant') %}"
    "{{ raise_exception('Unknown role: ' + m['role']) }}"
    "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def render(source: str, messages, add_generation_prompt: bool = True) -> str:
    return ChatTemplate(source).render(messages, add_generation_prompt, bos_token="<s>", eos_token="</s>")


def test_variables_and_generation_prompt():
    source = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{% if add_generation_prompt %}>{% endif %}"
    assert render(source, [ChatMessage("user", "hi")]) == "<s>hi</s>>"
    assert render(source, [ChatMessage("user", "hi")], add_generation_prompt=False) == "<s>hi</s>"


def test_blocks_are_trimmed_and_loop_controls_work():
    source = "{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n{{ m.content }}\n{% endfor %}"
    assert render(source, [ChatMessage("user", "a"), ChatMessage("user", "b")]) == "a\n"


def test_tojson_keeps_unicode():
    assert render("{{ messages[0] | tojson }}", [ChatMessage("user", "日本")]) == '{"role": "user", "content": "日本"}'


def test_raise_exception_becomes_chat_template_error():
    with pytest.raises(ChatTemplateError, match="Unknown role: tool"):
        render(STRICT, [ChatMessage("tool", "x")])
    assert render(STRICT, [ChatMessage("user", "x")]) == "user: x\nassistant:"


@pytest.mark.parametrize(
    "message, pattern",
    [
        ({"content": "no role"}, "'role' must be a non-empty string"),
        ({"role": "user"}, "'content' must be a string"),
        ({"role": "", "content": "x"}, "'role' must be a non-empty string"),
        ({"role": "user", "content": 5}, "'content' must be a string"),
        (("user", "x"), "expected a ChatMessage or a mapping"),
    ],
)
def test_malformed_messages(message, pattern):
    with pytest.raises(ChatTemplateError, match=pattern):
        render(STRICT, [ChatMessage("system", "ok"), message])


def test_empty_conversation():
    with pytest.raises(ChatTemplateError, match="at least one message"):
        render(STRICT, [])


def test_syntax_error_is_reported_at_load():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_runtime_type_error_is_reported():
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        render("{{ messages[0].content + 1 }}", [ChatMessage("user", "x")])


def test_sandbox_blocks_attribute_escapes():
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        render(escape, [ChatMessage("user", "x")])


def test_sandbox_is_immutable():
    with pytest.raises(ChatTemplateError):
        render("{% set _ = messages.append(1) %}", [ChatMessage("user", "x")])


def test_no_template_is_a_clear_error(smol):
    bare = FastTokenizer(smol.backend, SpecialTokens(1, (2,)), chat_template=None)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        bare.apply_chat_template([ChatMessage("user", "hi")])
    assert bare.encode("hi") == smol.encode("hi")


def test_unknown_role_accepted_by_a_lenient_template(smol):
    ids = smol.apply_chat_template([ChatMessage("tool", "42")])
    assert smol.decode(ids).startswith("system\nYou are a helpful AI assistant")
    assert "tool\n42" in smol.decode(ids)


def test_strftime_now_is_available():
    text = render("{{ strftime_now('%Y') }}", [ChatMessage("user", "x")])
    assert text.isdigit() and len(text) == 4
