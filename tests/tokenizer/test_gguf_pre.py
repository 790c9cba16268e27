"""`tokenizer.ggml.pre`: llama.cpp's split per name, the missing name, and names refused at load."""

from __future__ import annotations

import pytest
from tests.tokenizer.gguf_files import write_bpe
from tokenizers import Regex, pre_tokenizers

from pdserve.tokenizer import UnsupportedTokenizerError, load_tokenizer
from pdserve.tokenizer.gguf_bpe import pre_tokenizer
from pdserve.tokenizer.gguf_pre import DEFAULT, GPT2, LLAMA3, PRE_SPLITS, QWEN2, SMOLLM, PreSplit, pre_split


def _words(split: PreSplit, text: str) -> list[str]:
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in split.regexes]
    return [word for word, _ in pre_tokenizers.Sequence(steps).pre_tokenize_str(text)]


def test_every_accepted_name_compiles():
    for name, split in PRE_SPLITS.items():
        assert pre_tokenizer(split, {}) is not None, name


def test_missing_or_empty_name_is_llamacpps_default():
    assert pre_split(None) is DEFAULT and pre_split("") is DEFAULT and pre_split("default") is DEFAULT


def test_unknown_name_is_refused_by_name(tmp_path):
    with pytest.raises(UnsupportedTokenizerError, match="'tekken'"):
        pre_split("tekken")
    with pytest.raises(UnsupportedTokenizerError, match="pre-tokenizer 'made-up'"):
        load_tokenizer(write_bpe(tmp_path / "odd.gguf", pre="made-up"))


def test_names_share_llamacpps_types():
    assert pre_split("smollm") is SMOLLM and pre_split("starcoder") is SMOLLM
    assert pre_split("llama-bpe") is LLAMA3 and pre_split("qwen2") is QWEN2 and pre_split("gpt-2") is GPT2
    assert LLAMA3.ignore_merges and LLAMA3.add_bos and not SMOLLM.add_bos


def test_smollm_isolates_every_digit():
    assert _words(SMOLLM, "in 2025, x²=½") == ["in", " ", "2", "0", "2", "5", ",", " x", "²", "=", "½"]


def test_gpt2_keeps_digit_runs_and_llama3_cuts_them_by_three():
    assert _words(GPT2, "a 12345") == ["a", " 12345"]
    assert _words(LLAMA3, "a 12345") == ["a", " ", "123", "45"]
    assert _words(QWEN2, "12") == ["1", "2"]


def test_contractions_are_case_sensitive_in_gpt2_only():
    assert _words(GPT2, "IT'S") == ["IT", "'", "S"]
    assert _words(LLAMA3, "IT'S") == ["IT", "'S"]
    assert _words(LLAMA3, "x'\u017fa") == ["x", "'\u017fa"]  # no case folding: not "'s" + "a"


def test_default_cuts_punctuation_and_digit_triples():
    assert _words(DEFAULT, "ab+=1234567") == ["ab", "+=", "123", "456", "7"]


def test_unicode_16_letters_are_unassigned_as_in_llamacpp():
    hieroglyph = "\U00013460"  # a letter since Unicode 16.0; llama.cpp's tables predate it
    assert _words(GPT2, f"a{hieroglyph}'ll") == ["a", f"{hieroglyph}'", "ll"]
