"""Rules of the source tree, read with `ast` (nothing is imported): arrows point down, and the
statistics exist once.

- Nothing under pdserve/ but pdserve/cli/ imports pdserve.cli (the CLI sits on top: it parses
  flags and builds configs; everything else takes configs). Nothing in the services imports it either.
- Percentiles, distributions and SLOs are defined only in pdserve/stats.py.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("pdserve", "router", "prefill_service", "decode_service")
GENERATED = REPO / "pdserve" / "v1"
CLI = REPO / "pdserve" / "cli"
STATS = REPO / "pdserve" / "stats.py"

# NOTE: transitional, each with the reason; the test fails once an entry is no longer needed.
PENDING_UPWARD: set[tuple[str, str]] = set()

STATISTIC_NAME = re.compile(r"percentile|quantile|^median$|^_?p\d\d$", re.IGNORECASE)
STATISTIC_TYPES = {"Slo", "Percentiles", "Distribution"}


def source_files() -> Iterator[Path]:
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if not path.is_relative_to(GENERATED):
                yield path


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imported_modules(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def is_cli(module: str) -> bool:
    return module == "pdserve.cli" or module.startswith("pdserve.cli.")


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in source_files():
        if path.is_relative_to(CLI):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        found |= {(rel(path), _top_cli(m)) for m in imported_modules(tree) if is_cli(m)}
    return found


def _top_cli(module: str) -> str:
    """`pdserve.cli.options.runtime_config` -> `pdserve.cli.options` (the module, not the name)."""
    parts = module.split(".")
    return ".".join(parts[:3])


def statistics_defined() -> list[str]:
    found = []
    for path in source_files():
        if path == STATS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and STATISTIC_NAME.search(node.name):
                found.append(f"{rel(path)}:{node.lineno} def {node.name}")
            elif isinstance(node, ast.ClassDef) and node.name in STATISTIC_TYPES:
                found.append(f"{rel(path)}:{node.lineno} class {node.name}")
    return found


def test_nothing_but_the_cli_imports_the_cli():
    found = upward_imports()
    assert found <= PENDING_UPWARD, f"imports of pdserve.cli from below it: {sorted(found - PENDING_UPWARD)}"


def test_every_pending_upward_import_is_still_needed():
    stale = PENDING_UPWARD - upward_imports()
    assert not stale, f"no longer imported, remove from PENDING_UPWARD: {sorted(stale)}"


def test_statistics_are_defined_once():
    found = statistics_defined()
    assert not found, f"percentiles, distributions and SLOs belong in pdserve/stats.py: {found}"


def test_the_checks_see_what_they_look_for():
    stats = ast.parse(STATS.read_text())
    names = {n.name for n in ast.walk(stats) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"percentile", "Slo", "Distribution"} <= names
    tree = ast.parse("from pdserve.cli.up import x\nimport pdserve.cli\nfrom pdserve import cli\n"
                     "from pdserve.client import Client\n")
    assert sorted(m for m in imported_modules(tree) if is_cli(m)) == [
        "pdserve.cli", "pdserve.cli", "pdserve.cli.up", "pdserve.cli.up.x"]
