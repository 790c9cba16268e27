"""The model's name in the HTTP API, derived from where it was loaded."""

from __future__ import annotations

from pdserve.checkpoint.source import served_name


def test_the_embedded_model_is_named_without_its_quantisation():
    assert served_name(None) == "SmolLM2-135M-Instruct"


def test_a_folder_names_its_model(tmp_path):
    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert served_name(str(folder)) == "Llama-3.1-8B-Instruct"
