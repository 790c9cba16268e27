"""SentencePiece GGUF vocabularies on a small one written here: ids as llama.cpp gives them (worked
out with llama-cpp-python 0.3.36 on the same file) and as the port of its algorithm gives them."""

from __future__ import annotations

import pytest
from tests.tokenizer.gguf_files import SPM_PIECES, SPM_USER_DEFINED, spm_tokens, write_spm
from tests.tokenizer.llamacpp_spm import LlamaCppSpm, encode

from pdserve.tokenizer import load_tokenizer
from pdserve.tokenizer.gguf_spm import score_merges

TEXTS = ["abc", " abc", "ab c", "zü", "a<br>bc", "a\nb", "", " ", "xé x", "a  b", "bcabc", "\u2581a", "c" * 7]


def _pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.backend.id_to_token(i) for i in tokenizer.encode(text, add_special_tokens=False)]


@pytest.fixture(scope="module")
def with_prefix(tmp_path_factory):
    return load_tokenizer(write_spm(tmp_path_factory.mktemp("spm") / "v.gguf"))


@pytest.fixture(scope="module")
def without_prefix(tmp_path_factory):
    return load_tokenizer(write_spm(tmp_path_factory.mktemp("spm") / "v.gguf", add_space_prefix=False))


def test_joins_best_scored_pair_first_with_a_space_prefix(with_prefix):
    assert _pieces(with_prefix, "abc") == ["\u2581", "abc"]  # bc (-0.7), then abc (-0.6); never ▁a
    assert _pieces(with_prefix, "ab c") == ["\u2581ab", "\u2581", "c"]
    assert _pieces(with_prefix, " abc") == ["\u2581", "\u2581", "abc"]


def test_prefix_again_after_a_whole_matched_token(with_prefix):
    assert _pieces(with_prefix, "a<br>bc") == ["\u2581a", "<br>", "\u2581", "bc"]
    assert _pieces(with_prefix, "<s>a") == ["<s>", "\u2581a"]


def test_no_prefix_when_the_file_says_so(without_prefix):
    assert _pieces(without_prefix, "abc") == ["abc"]
    assert _pieces(without_prefix, "a<br>bc") == ["a", "<br>", "bc"]


def test_byte_fallback_for_characters_outside_the_vocabulary(with_prefix):
    assert _pieces(with_prefix, "zü") == ["\u2581", "<0x7A>", "<0xC3>", "<0xBC>"]
    assert with_prefix.decode(with_prefix.encode("zü")) == "zü"


@pytest.mark.parametrize("prefix", [True, False])
def test_equals_the_port_of_llamacpp(with_prefix, without_prefix, prefix):
    tokenizer = with_prefix if prefix else without_prefix
    tokens = spm_tokens()
    scores = [0.0] * (len(tokens) - len(SPM_PIECES)) + list(SPM_PIECES.values())
    port = LlamaCppSpm(tokens, scores, add_space_prefix=prefix)
    whole = {token: tokens.index(token) for token in SPM_USER_DEFINED}
    for text in TEXTS:
        assert tokenizer.encode(text, add_special_tokens=False) == encode(port, text, whole), repr(text)


def test_bos_by_default_and_eos_when_asked(tmp_path):
    bos_default = load_tokenizer(write_spm(tmp_path / "a.gguf"))
    assert bos_default.encode("a") == [1, *bos_default.encode("a", add_special_tokens=False)]
    no_bos = load_tokenizer(write_spm(tmp_path / "b.gguf", add_bos=False, add_eos=True))
    assert no_bos.encode("a") == [*no_bos.encode("a", add_special_tokens=False), 2]


def test_llamacpps_ids_when_the_file_names_none(tmp_path):
    tokenizer = load_tokenizer(write_spm(tmp_path / "v.gguf", with_ids=False))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids) == (1, (2,))
    assert tokenizer.encode("a")[0] == 1


@pytest.mark.parametrize("text", [t for t in TEXTS if "\u2581" not in t])  # a typed "▁" comes back " "
def test_decode_round_trips(with_prefix, without_prefix, text):
    assert without_prefix.decode(without_prefix.encode(text)) == text
    if not any(token in text for token in SPM_USER_DEFINED):  # else a prefix space follows each
        assert with_prefix.decode(with_prefix.encode(text)) == text


def test_user_defined_tokens_are_kept_by_decode(with_prefix):
    ids = with_prefix.encode("a\nb", add_special_tokens=False)
    assert with_prefix.decode(ids) == "a\n b"  # llama.cpp's prefix after "\n" stays, as in llama.cpp
    assert not set(ids) & with_prefix.special_token_ids


def test_score_merges_ranks_every_split_by_the_joined_score():
    merges = score_merges(["a", "b", "c", "ab", "bc", "abc"], [0.0, 0.0, 0.0, -2.0, -1.0, -0.5])
    assert merges == [("a", "bc"), ("ab", "c"), ("b", "c"), ("a", "b")]
