"""The GGUF tokenizer on the embedded SmolLM2: encoding against llama.cpp's ids, decoding and chat
templates against transformers' GGUF loader (whose encoding splits digits unlike llama.cpp's
`smollm` pre-tokenizer, so it is no reference for ids of text with digits)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import pytest
from tests.tokenizer.gguf_files import write_bpe
from tests.tokenizer.texts import VARIED_TEXTS

from pdserve.tokenizer import ChatMessage, UnsupportedTokenizerError, load_tokenizer
from pdserve.tokenizer.gguf_metadata import GGUFFormatError, read_gguf_metadata
from pdserve.tokenizer.gguf_tokenizer import GGUFTokenizer, byte_alphabet

VARIED = json.loads((Path(__file__).parent / "data" / "llamacpp_varied.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("text, expected", list(zip(VARIED["texts"], VARIED["smollm2"])))
def test_encode_matches_llamacpp(smol, text, expected):
    """llama.cpp's ids with special-token strings parsed; SmolLM2 adds no BOS."""
    assert smol.encode(text, add_special_tokens=False) == expected
    assert smol.encode(text) == expected


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_decode_matches_transformers(smol, smol_reference, text):
    ids = smol_reference.encode(text)
    assert smol.decode(ids, skip_special_tokens=False) == smol_reference.decode(ids, skip_special_tokens=False)
    assert smol.decode(ids, skip_special_tokens=True) == smol_reference.decode(ids, skip_special_tokens=True)


def test_decode_of_random_ids_matches_transformers(smol, smol_reference):
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(smol.vocab_size) for _ in range(rng.randrange(1, 12))]
        for skip in (False, True):
            assert smol.decode(ids, skip_special_tokens=skip) == smol_reference.decode(ids, skip_special_tokens=skip)


def test_special_tokens_stay_whole(smol):
    ids = smol.encode("<|im_start|>user<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert smol.decode(ids, skip_special_tokens=True) == "user"


def test_metadata_facts(smol, smol_reference):
    assert smol.vocab_size == 49152 == len(smol_reference)
    assert smol.bos_token_id == 1
    assert smol.eos_token_ids == (2,)
    assert smol.special_token_ids == frozenset(range(17))


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Say hi in Japanese 🇯🇵"},
        {"role": "assistant", "content": "こんにちは！"},
        {"role": "user", "content": "  and   in code?\n\tprint('hi')"},
    ],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(smol, smol_reference, conversation, add_generation_prompt):
    expected = smol_reference.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=add_generation_prompt
    )["input_ids"]
    messages = [ChatMessage(m["role"], m["content"]) for m in conversation]
    assert smol.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    assert smol.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt) == expected


def test_load_tokenizer_none_is_embedded(smol):
    assert load_tokenizer(None).encode("Paris") == smol.encode("Paris")


def test_metadata_reader_agrees_with_gguf_package(gguf_path):
    ours = read_gguf_metadata(gguf_path)
    reader = gguf.GGUFReader(gguf_path)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.eos_token_id", "llama.rope.freq_base", "tokenizer.chat_template"):
        assert ours[key] == pytest.approx(reader.fields[key].contents())
    assert ours["tokenizer.ggml.merges"] == reader.fields["tokenizer.ggml.merges"].contents()
    assert ours["tokenizer.ggml.token_type"] == reader.fields["tokenizer.ggml.token_type"].contents()


def test_byte_alphabet_is_printable_and_one_to_one():
    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256
    assert all(ch.isprintable() and not ch.isspace() for ch in alphabet)
    assert alphabet[ord("a")] == "a" and alphabet[ord(" ")] == "\u0120"


def test_small_gguf_with_bos_and_template(tmp_path):
    tok = load_tokenizer(write_bpe(tmp_path / "tiny.gguf", add_bos=True, with_template=True))
    ab = len(byte_alphabet()) + 2
    assert tok.encode("abc") == [0, ab, 2 + ord("c")]
    assert tok.encode("abc", add_special_tokens=False) == [ab, 2 + ord("c")]
    assert tok.decode(tok.encode("héllo")) == "héllo"
    assert tok.apply_chat_template([ChatMessage("user", "ab")]) == [0, ab]
    assert (tok.bos_token_id, tok.eos_token_ids) == (0, (1,))


def test_small_gguf_with_bos_and_eos(tmp_path):
    tok = load_tokenizer(write_bpe(tmp_path / "tiny.gguf", add_bos=True, add_eos=True))
    assert tok.encode("c") == [0, 2 + ord("c"), 1]
    assert tok.decode(tok.encode("c")) == "c"
    assert tok.decode(tok.encode("c"), skip_special_tokens=False) == "<s>c</s>"


def test_unsupported_tokenizer_model_is_a_clear_error(tmp_path):
    path = write_bpe(tmp_path / "wpm.gguf", model="bert")
    with pytest.raises(UnsupportedTokenizerError, match="'bert' is not supported"):
        GGUFTokenizer(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"NOPE" + bytes(32))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        load_tokenizer(str(path))


def test_unknown_path_kind(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(UnsupportedTokenizerError, match="expected a .gguf file"):
        load_tokenizer(str(path))
