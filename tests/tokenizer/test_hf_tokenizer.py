"""The HF-folder tokenizer against transformers on two kinds of folder: SmolLM2's byte-level BPE
(saved from the GGUF) and a SentencePiece-style one (Metaspace, byte fallback, BOS added)."""

from __future__ import annotations

import json
import os

import pytest
from tests.tokenizer.texts import VARIED_TEXTS
from tests.tokenizer.spm_folder import write_spm_folder

from pdserve.tokenizer import ChatMessage, UnsupportedTokenizerError, load_tokenizer
from pdserve.tokenizer.hf_tokenizer import HFTokenizer


@pytest.fixture(scope="module")
def spm_reference(spm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spm_dir)


def test_saved_smol_folder_matches_gguf_and_transformers(smol_dir, smol, smol_reference):
    tok = load_tokenizer(smol_dir)
    assert isinstance(tok, HFTokenizer)
    for text in VARIED_TEXTS:
        assert tok.encode(text) == smol_reference.encode(text) == smol.encode(text)
    assert (tok.bos_token_id, tok.eos_token_ids, tok.vocab_size) == (1, (2,), 49152)
    conversation = [{"role": "user", "content": "Hi 👋"}]
    expected = smol_reference.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    assert tok.apply_chat_template(conversation) == expected["input_ids"]


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_spm_encode_decode_match_transformers(spm, spm_reference, text):
    ids = spm.encode(text)
    assert ids == spm_reference.encode(text)
    assert spm.encode(text, add_special_tokens=False) == spm_reference.encode(text, add_special_tokens=False)
    for skip in (True, False):
        assert spm.decode(ids, skip_special_tokens=skip) == spm_reference.decode(ids, skip_special_tokens=skip)


def test_spm_adds_bos_and_reads_generation_config(spm):
    assert spm.bos_token_id == 1
    assert spm.encode("hi")[0] == 1
    assert spm.encode("hi", add_special_tokens=False)[0] != 1
    assert spm.eos_token_ids == (2, 0)


@pytest.mark.parametrize("template_in_config", [True, False])
def test_spm_chat_template_matches_transformers(tmp_path, template_in_config):
    from transformers import AutoTokenizer

    folder = write_spm_folder(str(tmp_path), template_in_config=template_in_config)
    reference = AutoTokenizer.from_pretrained(folder)
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "The capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Germany? 🇩🇪"},
    ]
    expected = reference.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    tok = load_tokenizer(folder)
    assert tok.apply_chat_template([ChatMessage(**m) for m in conversation]) == expected["input_ids"]
    assert tok.render_chat(conversation[:1], add_generation_prompt=False) == "<s>[system] Be brief.</s>\n"


def test_jinja_file_wins_over_config(tmp_path):
    folder = write_spm_folder(str(tmp_path))
    with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert load_tokenizer(folder).render_chat([ChatMessage("user", "x")]) == "<user>x"


def test_named_templates_use_default(tmp_path):
    folder = write_spm_folder(str(tmp_path))
    config_path = os.path.join(folder, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "DEFAULT{{ messages[0].content }}"},
    ]
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    assert load_tokenizer(folder).render_chat([ChatMessage("user", "x")]) == "DEFAULTx"


def test_folder_without_tokenizer_json(tmp_path):
    with pytest.raises(UnsupportedTokenizerError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_tiny_model_tokenizer_matches_transformers(tmp_path):
    """The tokenizer the tiny test checkpoints ship (byte-level BPE, ChatML template)."""
    from transformers import AutoTokenizer

    from tests.helpers.tiny_models import BOS_ID, EOS_ID, build_tokenizer

    build_tokenizer(tmp_path)
    reference = AutoTokenizer.from_pretrained(str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    for text in VARIED_TEXTS:
        assert tok.encode(text) == reference.encode(text)
        assert tok.decode(tok.encode(text)) == reference.decode(reference.encode(text), skip_special_tokens=True)
    conversation = [{"role": "user", "content": "Hello! How are you today?"}]
    expected = reference.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
    assert tok.apply_chat_template(conversation) == expected["input_ids"]
    assert (tok.bos_token_id, tok.eos_token_ids[0]) == (BOS_ID, EOS_ID)
