"""Figures measured once per machine: kept on disk, read back by the next process, the first
writer's figure used by everyone, and an unwritable cache no error."""

from __future__ import annotations

from pdserve.measurements import measured


def test_a_figure_is_measured_once_and_read_back(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return {"rate": 1.5}

    assert measured("speed", {"model": "m"}, measure, tmp_path) == {"rate": 1.5}
    assert measured("speed", {"model": "m"}, measure, tmp_path) == {"rate": 1.5}
    assert len(calls) == 1
    assert measured("speed", {"model": "other"}, measure, tmp_path) == {"rate": 1.5}
    assert len(calls) == 2  # another key: measured again


def test_the_figure_kept_first_is_the_one_everyone_uses(tmp_path):
    def slow_rival():  # another process keeps its figure while this one measures
        measured("speed", {"model": "m"}, lambda: {"rate": 1.0}, tmp_path)
        return {"rate": 2.0}

    assert measured("speed", {"model": "m"}, slow_rival, tmp_path) == {"rate": 1.0}
    assert measured("speed", {"model": "m"}, lambda: {"rate": 3.0}, tmp_path) == {"rate": 1.0}
    assert [p.name for p in (tmp_path / "measured").iterdir() if p.name.startswith(".")] == []


def test_an_unwritable_cache_measures_and_keeps_nothing(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert measured("speed", {}, lambda: {"rate": 4.0}, blocked) == {"rate": 4.0}


def test_an_unreadable_figure_is_measured_again(tmp_path):
    measured("speed", {}, lambda: {"rate": 1.0}, tmp_path)
    (path,) = (tmp_path / "measured").iterdir()
    path.write_text("{not json")
    assert measured("speed", {}, lambda: {"rate": 5.0}, tmp_path) == {"rate": 5.0}
    assert measured("speed", {}, lambda: {"rate": 6.0}, tmp_path) == {"rate": 5.0}  # kept again


def test_another_cpu_or_thread_count_measures_again(tmp_path, monkeypatch):
    from pdserve import measurements

    assert measured("speed", {"threads": 1}, lambda: {"rate": 1.0}, tmp_path) == {"rate": 1.0}
    assert measured("speed", {"threads": 2}, lambda: {"rate": 2.0}, tmp_path) == {"rate": 2.0}
    monkeypatch.setattr(measurements, "_cpu_line", lambda field: f"another CPU's {field}")
    assert measured("speed", {"threads": 1}, lambda: {"rate": 3.0}, tmp_path) == {"rate": 3.0}


def test_keeping_measurements_turned_off_measures_at_every_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_KEEP_MEASUREMENTS", "0")
    assert measured("speed", {}, lambda: {"rate": 1.0}, tmp_path) == {"rate": 1.0}
    assert measured("speed", {}, lambda: {"rate": 2.0}, tmp_path) == {"rate": 2.0}
    assert not (tmp_path / "measured").exists()
