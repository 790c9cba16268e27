"""A model's fingerprint says what differs (weights, architecture, tokenizer), is the same for the
same files, and is read from the cache once computed; identities compare what KV depends on."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from pdserve.identity import ModelFingerprint, WorkerIdentity, model_fingerprint
from tests.helpers.tiny_models import tiny_llama_gqa_llama3, tiny_llama_untied

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity_models")
    a = tiny_llama_gqa_llama3(root / "a", seed=0)
    b = tiny_llama_gqa_llama3(root / "b", seed=5)  # same shapes, other weights
    c = tiny_llama_untied(root / "c")  # another architecture
    d = root / "d"  # a's weights, another tokenizer configuration
    shutil.copytree(a, d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["model_max_length"] = 77
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return {"a": a, "b": b, "c": c, "d": d}


def test_the_fields_that_differ_are_named(models, tmp_path):
    prints = {name: model_fingerprint(str(path), tmp_path) for name, path in models.items()}
    assert prints["a"].differences(model_fingerprint(str(models["a"]), tmp_path)) == ()
    assert prints["a"].differences(prints["b"]) == ("weights",)
    assert "architecture" in prints["a"].differences(prints["c"])
    assert prints["a"].differences(prints["d"]) == ("tokenizer",)


def test_a_fingerprint_is_kept_and_a_changed_file_is_read_again(models, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(models["a"], folder)
    first = model_fingerprint(str(folder), tmp_path / "cache")
    assert list((tmp_path / "cache" / "fingerprints").glob("*.json"))
    assert model_fingerprint(str(folder), tmp_path / "cache") == first
    shutil.copy(models["b"] / "model.safetensors", folder / "model.safetensors")  # new bytes, new mtime
    assert model_fingerprint(str(folder), tmp_path / "cache").differences(first) == ("weights",)


def test_the_embedded_model_has_a_fingerprint(tmp_path):
    fingerprint = model_fingerprint(None, tmp_path)
    assert all(len(v) == 32 for v in dataclasses.astuple(fingerprint))


def test_identities_compare_what_kv_depends_on_but_the_tensor_parallel_layout():
    model = ModelFingerprint("w", "a", "t")
    one = WorkerIdentity(model, "torch.float32", 16)
    assert one.differences(dataclasses.replace(one, tensor_parallel_size=2)) == ()
    assert one.kv_digest == dataclasses.replace(one, tensor_parallel_size=2).kv_digest
    assert one.differences(dataclasses.replace(one, block_size=32)) == ("block_size",)
    assert one.differences(dataclasses.replace(one, kv_dtype="torch.bfloat16", protocol=2)) == ("kv_dtype", "protocol")
    assert one.differences(dataclasses.replace(one, model=ModelFingerprint("w2", "a", "t"))) == ("weights",)
    assert len({one.kv_digest, dataclasses.replace(one, block_size=32).kv_digest}) == 2


def test_the_architecture_digest_leaves_out_the_name_and_fields_at_their_defaults(embedded_gguf_path):
    """A configuration field added later with a default changes no digest of a model that does
    not use it (workers across such a change still pair)."""
    import dataclasses

    from pdserve.checkpoint.source import read_model_config
    from pdserve.identity.fingerprint import _architecture

    config = read_model_config(str(embedded_gguf_path))
    digest = _architecture(config)
    assert "name" not in digest and digest == _architecture(dataclasses.replace(config, name="another"))
    defaults = {f.name for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING
                and getattr(config, f.name) == f.default}
    assert defaults and not defaults & set(digest)
