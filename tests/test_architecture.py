"""Rules of the source tree, read with `ast` (nothing is imported); the order of its folders and
the absence of import circles are tests/test_layering.py's.

- Percentiles, distributions and SLOs are defined and computed only in pdserve/stats.py (no other
  module calls the standard library's or numpy's median or percentiles).
- The client's protobuf types (and the health service's) are in pdserve/client/wire.py alone.
- Defaults live in the frozen configs: a CLI flag with a config field takes its default from
  it (never a literal), and each shared setting's value is written once in the tree.
- End-to-end tests call the router through pdserve.client: only the tests whose point is the
  wire itself import the public API's generated stubs.
- The router's process imports no torch: no module that router/main.py or the CLI's service
  command reaches through imports at module level imports torch at module level (the process
  itself is checked in tests/e2e/test_service.py).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from tests.helpers.source_tree import REPO, imported_modules, rel, source_files, source_of

CLI = REPO / "pdserve" / "cli"
STATS = REPO / "pdserve" / "stats.py"

# Flags whose default is a config field (docs/ARCHITECTURE.md, "Where each default lives"): in
# pdserve/cli/ their default is read from the config, never written as a literal.
CONFIG_FLAGS = frozenset({
    "--kv-timeout", "--wait-for-worker-s", "--drain-timeout-s", "--quarantine-timeout-s", "--kv-blocks",
    "--host-kv-blocks", "--block-size", "--policy", "--device", "--dtype", "--attention-backend", "--weight-layout",
    "--max-model-len", "--recompute-below-tokens", "--swap-above-tokens", "--top-p", "--top-k", "--min-p", "--port",
})
# NOTE: transitional, each with the reason; the test fails once an entry is no longer needed.
PENDING_LITERAL_FLAGS: dict[tuple[str, str], str] = {}
# Each setting (a pattern searched in names) with its default value: bound to that value in one file only,
# its home (a dataclass field, a constant, a parameter default, a keyword or a flag default).
SETTING_HOMES = {
    ("kv_timeout", 30.0): "pdserve/config.py",
    ("drain_timeout", 30.0): "pdserve/config.py",
    ("quarantine_timeout", 60.0): "pdserve/config.py",
    ("wait_for_worker", 5.0): "router/flow/flow_types.py",
    ("max_active", 1024): "router/doors/gateway.py",
    ("max_(registered_)?workers", 256): "router/fleet/discovery.py",
}
# NOTE: transitional, as PENDING_UPWARD.
PENDING_SETTING_COPIES: set[tuple[str, str]] = set()

# End-to-end tests and their helpers, and those of them that speak the public API's wire: each with the reason.
END_TO_END = ("tests/e2e", "tests/procs", "tests/helpers")
WIRE_TESTS = {
    "tests/e2e/test_input_limits.py": "requests of wire-level sizes (a 60 MB text, 8M ids), refused on their size",
    "tests/e2e/test_internal_plane.py": "worker requests on the internal plane carry the public sampling types",
    "tests/e2e/test_up_supervisor.py": "a decode worker called directly, with a worker request",
    "tests/e2e/test_observability.py": "the call's initial metadata (the traceparent the router answers with)",
}
# NOTE: transitional, as PENDING_UPWARD.
PENDING_WIRE_TESTS: dict[str, str] = {}

STATISTIC_NAME = re.compile(r"percentile|quantile|^median$|^_?p\d\d$", re.IGNORECASE)
STATISTIC_TYPES = {"Slo", "Percentiles", "Distribution"}
# Calls that compute a percentile another way (the standard library's, numpy's).
STATISTIC_CALLS = re.compile(r"^(statistics|np|numpy)\.(median|median_low|median_high|quantiles|percentile|quantile)$")


def module_level_imports(tree: ast.Module) -> Iterator[str]:
    """What importing the module imports at once: its top-level statements' imports (inside `if`
    and `try` too), never those in functions or under `if TYPE_CHECKING`."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from imported_modules(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body]


def torch_importers(roots: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules reached from `roots` by module-level imports that import torch themselves, each with
    the chain of modules that led to it."""
    chains: dict[str, list[str]] = {root: [root] for root in roots}
    pending, found = list(roots), {}
    while pending:
        module = pending.pop()
        path = source_of(module)
        if path is None:
            continue
        for name in module_level_imports(ast.parse(path.read_text(), filename=str(path))):
            if name == "torch" or name.startswith("torch."):
                found[module] = chains[module]
            parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)]
            for parent in parents:
                if parent not in chains and source_of(parent) is not None:
                    chains[parent] = [*chains[module], parent]
                    pending.append(parent)
    return found


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
            elif isinstance(node, ast.Call) and STATISTIC_CALLS.match(ast.unparse(node.func)):
                found.append(f"{rel(path)}:{node.lineno} {ast.unparse(node.func)}()")
    return found


def _number(node: ast.AST | None) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _number(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    return None


def _flag_defaults(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(--flag, the default's node) of every add_argument call with a default."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            for kw in node.keywords:
                if kw.arg == "default" and flags:
                    yield flags[0], kw.value


def literal_config_flags() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(CLI.glob("*.py")):
        for flag, default in _flag_defaults(ast.parse(path.read_text())):
            literal = isinstance(default, ast.Constant) and default.value is not None or _number(default) is not None
            if flag in CONFIG_FLAGS and literal:
                found.add((rel(path), flag))
    return found


def _number_bindings(tree: ast.AST) -> Iterator[tuple[str, float]]:
    """(name, number) of every literal number bound to a name: fields, constants, parameter and
    keyword defaults, flag defaults (by the flag's name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, _number(node.value)
        elif isinstance(node, ast.Assign):
            yield from ((t.id, _number(node.value)) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            yield from ((a.arg, _number(d)) for a, d in zip(positional[len(positional) - len(node.defaults):],
                                                             node.defaults))
            yield from ((a.arg, _number(d)) for a, d in zip(node.kwonlyargs, node.kw_defaults))
        elif isinstance(node, ast.Call):
            yield from ((kw.arg, _number(kw.value)) for kw in node.keywords if kw.arg)
    for flag, default in _flag_defaults(tree):
        yield flag.lstrip("-").replace("-", "_"), _number(default)


def setting_copies() -> set[tuple[str, str]]:
    """(setting, file) for each file but the setting's home that binds its default value."""
    found = set()
    for path in source_files():
        bindings = set(_number_bindings(ast.parse(path.read_text(), filename=str(path))))
        for (setting, value), home in SETTING_HOMES.items():
            if rel(path) != home and any(re.search(setting, name, re.IGNORECASE) and number == value for name, number in bindings):
                found.add((setting, rel(path)))
    return found


def is_public_wire(module: str) -> bool:
    return module.startswith("pdserve.v1.generation_pb2")


def wire_speaking_tests() -> set[str]:
    """End-to-end test files that import the public API's generated stubs."""
    found = set()
    for root in END_TO_END:
        for path in sorted((REPO / root).rglob("*.py")):
            if any(is_public_wire(m) for m in imported_modules(ast.parse(path.read_text(), filename=str(path)))):
                found.add(rel(path))
    return found


def test_end_to_end_tests_call_the_router_through_the_client():
    found = wire_speaking_tests() - set(WIRE_TESTS) - set(PENDING_WIRE_TESTS)
    assert not found, f"use pdserve.client (typed results), not generation_pb2, or add a reason to WIRE_TESTS: {found}"


def test_every_listed_wire_test_still_speaks_the_wire():
    stale = (set(WIRE_TESTS) | set(PENDING_WIRE_TESTS)) - wire_speaking_tests()
    assert not stale, f"no longer imports generation_pb2, remove from WIRE_TESTS/PENDING_WIRE_TESTS: {sorted(stale)}"


def test_cli_flags_take_their_defaults_from_the_configs():
    found = literal_config_flags() - set(PENDING_LITERAL_FLAGS)
    assert not found, f"flags with a config field must take its default (Config().field), not a literal: {found}"


def test_every_pending_literal_flag_is_still_there():
    stale = set(PENDING_LITERAL_FLAGS) - literal_config_flags()
    assert not stale, f"no longer literal, remove from PENDING_LITERAL_FLAGS: {sorted(stale)}"


def test_each_shared_default_is_written_once():
    found = setting_copies() - PENDING_SETTING_COPIES
    assert not found, f"defaults written outside their home (read them from it instead): {sorted(found)}"


def test_every_pending_setting_copy_is_still_there():
    stale = PENDING_SETTING_COPIES - setting_copies()
    assert not stale, f"no longer a copy, remove from PENDING_SETTING_COPIES: {sorted(stale)}"


def test_the_default_checks_see_what_they_look_for():
    homes = {home: set(_number_bindings(ast.parse((REPO / home).read_text()))) for home in set(SETTING_HOMES.values())}
    for (setting, value), home in SETTING_HOMES.items():
        assert any(re.search(setting, name, re.IGNORECASE) and number == value for name, number in homes[home]), (setting, home)
    tree = ast.parse('p.add_argument("--kv-timeout", type=float, default=30.0)\n'
                     'def f(x, kv_timeout_s: float = 30.0, *, y=-1): ...\nFlow(kv_timeout_s=30)\n')
    assert [(f, _number(d)) for f, d in _flag_defaults(tree)] == [("--kv-timeout", 30.0)]
    assert {b for b in _number_bindings(tree) if b[1] is not None} == {
        ("kv_timeout", 30.0), ("kv_timeout_s", 30.0), ("y", -1), ("default", 30.0)}


ROUTER_ROOTS = ("router.main", "pdserve.cli.main", "pdserve.cli.services")


def test_the_router_process_imports_no_torch():
    found = torch_importers(ROUTER_ROOTS)
    assert not found, f"the router's modules import torch (move what it needs below the engine): {found}"


def test_the_torch_check_sees_what_it_looks_for():
    tree = ast.parse("import torch\nif TYPE_CHECKING:\n    import numpy\ntry:\n    from a.b import c\n"
                     "except ImportError:\n    pass\ndef f():\n    import d\n")
    assert sorted(module_level_imports(tree)) == ["a.b", "a.b.c", "torch"]
    assert "pdserve.model.loader" in torch_importers(("pdserve.engine.engine",))


def test_statistics_are_defined_once():
    found = statistics_defined()
    assert not found, f"percentiles, distributions and SLOs belong in pdserve/stats.py: {found}"


CLIENT = REPO / "pdserve" / "client"
CLIENT_WIRE = CLIENT / "wire.py"


def is_wire_type(module: str) -> bool:
    return module.startswith(("pdserve.v1", "grpc_health"))


def test_the_client_speaks_protobuf_only_in_its_wire_module():
    found = {rel(path) for path in sorted(CLIENT.glob("*.py")) if path != CLIENT_WIRE
             and any(is_wire_type(m) for m in imported_modules(ast.parse(path.read_text())))}
    assert not found, f"protobuf types outside pdserve/client/wire.py: {sorted(found)}"


def test_the_checks_see_what_they_look_for():
    stats = ast.parse(STATS.read_text())
    names = {n.name for n in ast.walk(stats) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"percentile", "Slo", "Distribution"} <= names
    assert [bool(STATISTIC_CALLS.match(c)) for c in ("statistics.median", "np.percentile", "statistics.mean")] == [
        True, True, False]
    assert is_wire_type("grpc_health.v1.health_pb2") and not is_wire_type("grpc")
    wire = ast.parse("from pdserve.v1 import generation_pb2 as pb\nimport pdserve.v1.generation_pb2_grpc\n"
                     "from pdserve.v1 import worker_pb2\nfrom pdserve.client import Client\n")
    assert sorted(m for m in imported_modules(wire) if is_public_wire(m)) == [
        "pdserve.v1.generation_pb2", "pdserve.v1.generation_pb2_grpc"]
