"""How llama.cpp splits text before byte-level BPE, per `tokenizer.ggml.pre`.

From llama.cpp's src/llama-vocab.cpp (as vendored by llama-cpp-python 0.3.36): `impl::load` maps a
pre name to a pre type, `llm_tokenizer_bpe` gives each type a list of regexes. The regexes run in
turn, each on every piece the ones before it left; the text between two matches stays a piece of
its own (tokenizers' Split behavior "isolated"). Only types whose regexes Oniguruma (the
`tokenizers` regex engine) reads exactly as llama.cpp does are here; any other name is refused.

NOTE: a file without `tokenizer.ggml.pre` (or with an empty one) gets llama.cpp's 'default' type,
the four regexes below, not Llama 3's nor GPT-2's split: llama.cpp warns that quality degrades.

Where llama.cpp's regexes differ from the model's own tokenizer.json (contractions spelled
`'[sS]` instead of `(?i:'s)`, which also matched U+017F), llama.cpp's spelling is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.tokenizer.base import UnsupportedTokenizerError


@dataclass(frozen=True)
class PreSplit:
    """One llama.cpp pre type."""

    name: str  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_<name>
    regexes: tuple[str, ...]  # applied in turn, each to every piece left so far
    ignore_merges: bool = False  # a piece that is itself a vocabulary entry is that one token
    add_bos: bool = False  # llama.cpp's default when the file has no `tokenizer.ggml.add_bos_token`


# Oniguruma (the regex engine of `tokenizers` 0.23) knows Unicode 16.0; llama.cpp's category tables
# (src/unicode-data.cpp) stop at 15.1 and count what 16.0 added as unassigned. Every \p{L}, \p{N}
# and \p{P} below leaves those code points out, so that both engines agree on them.
_UNICODE_16 = {
    "L": r"\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}"
         r"\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}"
         r"\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}\x{16100}-\x{1611D}"
         r"\x{16D40}-\x{16D6C}\x{18CFF}\x{1E5D0}-\x{1E5ED}\x{1E5F0}",
    "N": r"\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139}\x{16D70}-\x{16D79}"
         r"\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA}",
    "P": r"\x{1B4E}-\x{1B4F}\x{1B7F}\x{10D6E}\x{113D4}-\x{113D5}\x{113D7}-\x{113D8}\x{11BE1}\x{16D6D}-\x{16D6F}"
         r"\x{1E5FF}",
}


def _split(name: str, *regexes: str, ignore_merges: bool = False, add_bos: bool = False) -> PreSplit:
    """A PreSplit from llama.cpp's regexes, their categories narrowed to llama.cpp's tables."""
    for category, added in _UNICODE_16.items():
        regexes = tuple(r.replace(rf"\p{{{category}}}", rf"[\p{{{category}}}&&[^{added}]]") for r in regexes)
    return PreSplit(name, regexes, ignore_merges, add_bos)


_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# llama.cpp writes it without the last `|\s+`; its own matcher (unicode_regex_split_custom_gpt2)
# has that branch, and without it the unmatched text would be the same single characters.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# The regexes with literal non-ASCII ranges, written as code points: several of their characters
# (U+1FD3, U+212A, ...) have canonical equivalents that a text editor may silently substitute.
# NOTE: llama.cpp runs a regex without \p{..} through std::wregex after turning every non-ASCII
# whitespace character into U+000B, so a whitespace member of such a class (U+3000 below) never
# matches as itself there; `&&\S` takes it out here.
_DEEPSEEK_LETTERS = (
    r"A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}"
    r"\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}"
    r"\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}"
    r"\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}"
    r"\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}"
    r"\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}"
    r"\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}"
    r"\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}"
    r"\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}"
    r"\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}"
    r"\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}"
    r"\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}"
    r"\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}"
)
_DEEPSEEK_PUNCTUATION = r"!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}"
_CJK_HANGUL = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}&&\S]+"

DEFAULT = _split("DEFAULT", r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
LLAMA3 = _split("LLAMA3", _LLAMA3, ignore_merges=True, add_bos=True)
DBRX = _split("DBRX", _LLAMA3)
SMAUG = _split("SMAUG", _LLAMA3)
GPT2 = _split("GPT2", _GPT2)
SMOLLM = _split("SMOLLM", r"\p{N}", _GPT2)  # every digit alone, then GPT-2's split
QWEN2 = _split("QWEN2", _QWEN2)
FALCON = _split("FALCON", r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")
DEEPSEEK_LLM = _split(
    "DEEPSEEK_LLM",
    "[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+", rf"\s?[{_DEEPSEEK_PUNCTUATION}&&\S]+", r"\s+\z", _CJK_HANGUL, r"\p{N}+",
)
DEEPSEEK_CODER = _split("DEEPSEEK_CODER", "[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")


def _named(split: PreSplit, *names: str) -> dict[str, PreSplit]:
    return dict.fromkeys(names, split)


PRE_SPLITS: dict[str, PreSplit] = {
    **_named(DEFAULT, "default"),
    **_named(LLAMA3, "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
             "jina-v5-nano"),
    **_named(DBRX, "dbrx"),
    **_named(SMAUG, "smaug-bpe"),
    **_named(GPT2, "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
             "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4"),
    **_named(SMOLLM, "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
    **_named(QWEN2, "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"),
    **_named(FALCON, "falcon"),
    **_named(DEEPSEEK_LLM, "deepseek-llm"),
    **_named(DEEPSEEK_CODER, "deepseek-coder"),
}
"""`tokenizer.ggml.pre` names accepted, each with llama.cpp's split for it."""


def pre_split(name: str | None, path: str = "") -> PreSplit:
    """llama.cpp's split for a `tokenizer.ggml.pre` value; None or "" (key absent) is 'default'.

    Raises UnsupportedTokenizerError, naming the value, for any name not in PRE_SPLITS.
    """
    if not name:
        return DEFAULT
    split = PRE_SPLITS.get(name)
    if split is None:
        raise UnsupportedTokenizerError(
            f"{path}: pre-tokenizer {name!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {', '.join(sorted(PRE_SPLITS))}"
        )
    return split
