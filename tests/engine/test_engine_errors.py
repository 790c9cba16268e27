"""Errors: models that cannot be loaded, requests that can never be served, duplicate ids. The
engine is unchanged by a refused request and serves the next one normally."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from pdserve.config import EngineConfig
from pdserve.engine.engine import Engine
from pdserve.errors import DuplicateRequestError, InvalidRequestError
from pdserve.engine.llm import LLM
from pdserve.checkpoint.errors import ModelLoadError
from tests.engine.driver import (GREEDY, Arrival, Trace, add, assert_all_blocks_released, make_engine, run, step,
                                 tiny_prompt)

MODEL = "llama_gqa_llama3"  # 512 positions, vocabulary of 384


def _load_error(model: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        Engine(EngineConfig(model=model))
    return str(caught.value)


def test_missing_model_path(tmp_path: Path):
    assert "does not exist" in _load_error(str(tmp_path / "nowhere.gguf"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLM(EngineConfig(model=str(tmp_path / "nowhere")))


def test_corrupt_gguf_files(tmp_path: Path, embedded_gguf_path: Path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(os.urandom(4096))
    assert "not a readable GGUF file" in _load_error(str(garbage))
    bad_version = tmp_path / "bad_version.gguf"
    bad_version.write_bytes(b"GGUF" + (999).to_bytes(4, "little") + os.urandom(4096))
    assert "not a readable GGUF file" in _load_error(str(bad_version))
    truncated = tmp_path / "truncated.gguf"
    with open(embedded_gguf_path, "rb") as source:
        truncated.write_bytes(source.read(5_000_000))
    assert "not a readable GGUF file" in _load_error(str(truncated))


def test_folders_without_weights_or_config(tmp_path: Path, tiny_model_dirs: dict[str, Path]):
    no_weights = tmp_path / "no_weights"
    shutil.copytree(tiny_model_dirs[MODEL], no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    assert "no *.safetensors" in _load_error(str(no_weights))
    no_config = tmp_path / "no_config"
    shutil.copytree(tiny_model_dirs[MODEL], no_config, ignore=shutil.ignore_patterns("config.json"))
    assert "no config.json" in _load_error(str(no_config))
    other_file = tmp_path / "model.bin"
    other_file.write_bytes(b"\0" * 64)
    assert "expected a .gguf file" in _load_error(str(other_file))


def _bad_requests(vocab: int) -> list[tuple[str, list[int], object, type[Exception], str]]:
    prompt = tiny_prompt(12, vocab, seed=1)
    return [
        ("long", tiny_prompt(600, vocab, seed=2), GREEDY, InvalidRequestError, "exceeds the model's context of 512"),
        ("long-output", tiny_prompt(500, vocab, seed=3), GREEDY, InvalidRequestError, "exceeds the model's context"),
        ("empty", [], GREEDY, InvalidRequestError, "the prompt is empty"),
        ("vocab", [*prompt, vocab], GREEDY, InvalidRequestError, f"token id {vocab} is outside the vocabulary"),
        ("negative", [-1, *prompt], GREEDY, InvalidRequestError, "token id -1 is outside the vocabulary"),
        ("no-tokens", prompt, replace(GREEDY, max_tokens=0), InvalidRequestError, "max_tokens must be at least 1"),
        ("top-p", prompt, replace(GREEDY, top_p=0.0), InvalidRequestError, "top_p"),
        ("stop-id", prompt, replace(GREEDY, stop_token_ids=(vocab,)), InvalidRequestError, "stop_token_ids"),
        ("running", prompt, GREEDY, DuplicateRequestError, "already running"),
    ]


def test_refused_requests_change_nothing_and_the_engine_goes_on(tiny_loaded, oracle):
    loaded = tiny_loaded[MODEL]
    vocab = loaded.config.vocab_size
    engine = make_engine(loaded, max_chunk_tokens=8)
    running = Arrival("running", tiny_prompt(40, vocab, seed=4))
    trace = Trace()
    add(engine, trace, running)
    for request_id, prompt, sampling, error, message in _bad_requests(vocab):
        step(engine, trace)
        before = engine.scheduler.stats()
        with pytest.raises(error, match=message):
            engine.add_request(request_id, prompt, sampling)
        assert engine.scheduler.stats() == before
        assert engine.scheduler.get(request_id) in (None, trace.requests["running"])
        engine.scheduler.check_integrity()
    while engine.has_unfinished():
        step(engine, trace)
    assert trace.tokens("running") == oracle.greedy(MODEL, running.prompt, GREEDY.max_tokens)
    after = Arrival("running", tiny_prompt(23, vocab, seed=5))  # a finished request's id may be used again
    assert run(engine, [after]).tokens("running") == oracle.greedy(MODEL, after.prompt, GREEDY.max_tokens)
    assert_all_blocks_released(engine)


def test_limits_from_config_and_pool(tiny_loaded):
    loaded = tiny_loaded[MODEL]
    prompt = tiny_prompt(60, loaded.config.vocab_size, seed=6)
    short_context = Engine(replace(make_engine(loaded).config, max_model_len=64), loaded=loaded)
    with pytest.raises(InvalidRequestError, match="context of 64 tokens"):
        short_context.add_request("a", prompt, GREEDY)
    small_pool = make_engine(loaded, block_size=4, num_blocks=16)
    with pytest.raises(InvalidRequestError, match="KV pool of 64 tokens"):
        small_pool.add_request("a", prompt, GREEDY)
    assert run(small_pool, [Arrival("b", prompt[:40])]).requests["b"].finish_reason.value == "length"


def test_request_filling_the_context_exactly(tiny_loaded, oracle):
    loaded = tiny_loaded[MODEL]
    prompt = tiny_prompt(500, loaded.config.vocab_size, seed=9)
    engine = make_engine(loaded, max_chunk_tokens=128)
    with pytest.raises(InvalidRequestError, match="= 513 exceeds"):
        engine.add_request("over", prompt, replace(GREEDY, max_tokens=13))
    sampling = replace(GREEDY, max_tokens=12)
    trace = run(engine, [Arrival("exact", prompt, sampling)])
    assert trace.tokens("exact") == oracle.greedy(MODEL, prompt, 12)
    assert trace.requests["exact"].num_tokens == 512


def test_duplicate_id_of_a_waiting_or_running_request(tiny_loaded):
    loaded = tiny_loaded[MODEL]
    vocab = loaded.config.vocab_size
    engine = make_engine(loaded, num_blocks=20, max_chunk_tokens=16)
    first = engine.add_request("a", tiny_prompt(30, vocab, seed=7), GREEDY)
    with pytest.raises(DuplicateRequestError):
        engine.add_request("a", tiny_prompt(5, vocab, seed=8), GREEDY)
    assert first.state.name == "WAITING" and engine.scheduler.get("a") is first
    engine.step()
    with pytest.raises(DuplicateRequestError):
        engine.add_request("a", tiny_prompt(5, vocab, seed=8), GREEDY)
    assert engine.scheduler.stats().running == 1
    assert engine.abort("a") and not engine.abort("a")
    engine.step()
    assert_all_blocks_released(engine)
