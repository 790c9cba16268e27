"""The project's source files and their imports, read with `ast` (nothing is imported), for the
tests of the tree's rules (tests/test_architecture.py, tests/test_layering.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ("pdserve", "router", "prefill_service", "decode_service")
GENERATED = REPO / "pdserve" / "v1"


def source_files() -> Iterator[Path]:
    for root in SOURCE_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if not path.is_relative_to(GENERATED):
                yield path


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imported_modules(tree: ast.AST) -> Iterator[str]:
    """Every module an import anywhere in `tree` may name (in functions and under TYPE_CHECKING
    too): `from a.b import c` yields a.b and a.b.c, since c may be a module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def source_of(module: str) -> Path | None:
    """The file a dotted module name is read from, None where it is not this tree's."""
    path = REPO / module.replace(".", "/")
    return next((p for p in (path / "__init__.py", path.with_suffix(".py")) if p.is_file()), None)


def imported_files(path: Path) -> set[Path]:
    """The tree's files that `path` imports (a package's __init__.py where the package itself is
    named), itself left out."""
    found = {source_of(m) for m in imported_modules(parse(path))}
    return {p for p in found if p is not None and p != path and not p.is_relative_to(GENERATED)}
