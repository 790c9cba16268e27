"""The tree's order, read with `ast` (nothing is imported): the rooms (a folder of pdserve/, a
module directly in it, or a service package) stand in LAYERS from the ground up, and a room
imports only rooms of lower layers (and itself); no files import each other in a circle. Every
import counts: at module level, in a function, under TYPE_CHECKING. docs/ARCHITECTURE.md draws
the same order.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.source_tree import REPO, imported_files, rel, source_files

# From the ground up. A room may import the rooms of the layers below its own, never one beside it
# or above it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # values everyone shares: configs, the request's types and errors, statistics, files kept in the
    # cache; processes seen from outside; the C kernels and their builder (they import nothing of ours)
    ("pdserve/config.py", "pdserve/errors.py", "pdserve/requests.py", "pdserve/stats.py", "pdserve/kept_file.py",
     "pdserve/coalescing.py", "pdserve/aborts.py", "pdserve/reattach.py", "pdserve/start_phases.py",
     "pdserve/procs", "pdserve/native"),
    # memory and measurement: KV blocks, sampling, structured output's grammars, the machine's figures,
    # telemetry
    ("pdserve/kv", "pdserve/sampling", "pdserve/grammar", "pdserve/measurements.py", "pdserve/telemetry"),
    # request checks (a constraint's grammar included)
    ("pdserve/validation.py",),
    # the engine's parts: scheduling, attention, checkpoints read without torch, KV transfer; admission
    # by predicted time to first token and the elastic fleet's planner (policies over numbers, the
    # router's and the simulator's)
    ("pdserve/scheduler", "pdserve/attention", "pdserve/checkpoint", "pdserve/transfer", "pdserve/admission",
     "pdserve/elastic"),
    # the model and the text
    ("pdserve/model", "pdserve/tokenizer", "pdserve/identity"),
    # the model's CPU paths (a transform on it); a model across ranks; the public client
    ("pdserve/cpu", "pdserve/parallel", "pdserve/client"),
    # the in-process engine; the wire's shared parts; the load generator
    ("pdserve/engine", "pdserve/rpc", "pdserve/bench"),
    # what the worker services share; the simulator; the chaos harness
    ("pdserve/worker", "pdserve/sim", "pdserve/chaos"),
    # the services
    ("router", "prefill_service", "decode_service"),
    # the command line, on top
    ("pdserve/cli",),
)


def room_of(path: Path) -> str:
    parts = Path(rel(path)).parts
    if parts[0] != "pdserve":
        return parts[0]
    return "/".join(parts[:2])


def layer_of() -> dict[str, int]:
    return {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def imports_against_the_order() -> list[str]:
    layers, found = layer_of(), []
    for path in source_files():
        room = room_of(path)
        if room not in layers:
            continue
        for imported in imported_files(path):
            other = room_of(imported)
            if other != room and other in layers and layers[other] >= layers[room]:
                found.append(f"{rel(path)} -> {rel(imported)} ({room} may not import {other})")
    return found


def file_circles(graph: dict[Path, set[Path]]) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan's algorithm, iteratively)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    circles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(rel(p) for p in group))
    return circles


def import_graph() -> dict[Path, set[Path]]:
    return {path: imported_files(path) for path in source_files()}


def test_every_room_has_its_layer():
    rooms = {room_of(p) for p in source_files()} - {"pdserve/__init__.py"}
    assert rooms <= set(layer_of()), f"rooms without a layer (add them to LAYERS): {sorted(rooms - set(layer_of()))}"
    assert set(layer_of()) <= rooms, f"layers name rooms that are gone: {sorted(set(layer_of()) - rooms)}"


def test_rooms_import_only_the_layers_below_them():
    found = imports_against_the_order()
    assert not found, "imports against the order of LAYERS:\n" + "\n".join(found)


def test_no_files_import_each_other_in_a_circle():
    circles = file_circles(import_graph())
    assert not circles, f"files that import each other in a circle: {circles}"


def test_the_circle_check_sees_a_circle():
    a, b, c, d = (REPO / n for n in ("a.py", "b.py", "c.py", "d.py"))
    assert file_circles({a: {b}, b: {c}, c: {a, d}, d: set()}) == [["a.py", "b.py", "c.py"]]
    assert file_circles({a: {b}, b: set()}) == []


def test_the_order_check_sees_an_import_upward():
    assert room_of(REPO / "pdserve/kv/manager.py") == "pdserve/kv"
    assert room_of(REPO / "pdserve/config.py") == "pdserve/config.py"
    assert room_of(REPO / "router/doors/http/app.py") == "router"
    layers = layer_of()
    assert layers["pdserve/cli"] > layers["router"] > layers["pdserve/engine"] > layers["pdserve/kv"]
