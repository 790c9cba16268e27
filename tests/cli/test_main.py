"""The command line has every subcommand, and one whose module fails to import is an error."""

from __future__ import annotations

import pytest

from pdserve.cli import main


def test_every_subcommand_is_offered():
    sub = next(a for a in main.build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(main.SUBCOMMANDS)


@pytest.mark.parametrize("missing", ["pdserve.cli.no_such_service", "pdserve.no_such_package.cli"])
def test_a_subcommand_that_fails_to_import_fails_the_command_line(monkeypatch, missing):
    monkeypatch.setitem(main.SUBCOMMANDS, "gone", missing)
    with pytest.raises(ImportError, match="pdserve gone"):
        main.build_parser()
