"""The package's layers: no package imports one above it (the import graph between the
top-level modules and sub-packages of ``speclimits`` has no cycle), and the low layers stay low."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import speclimits

ROOT = Path(speclimits.__file__).parent

#: What the data-contract and harness layers may import (besides themselves and third parties).
ALLOWED = {
    "errors": set(),
    "vocabulary": set(),
    "jsonutil": {"errors"},
    "machine": {"errors"},  # the CPU record and what the engine can run on it
    "planted": set(),  # the designed experiment's routing (numpy only), planted by the harness
    "trace": {"errors", "jsonutil", "machine", "vocabulary"},
    "tracing": {"cliutil", "errors", "jsonutil", "machine", "planted", "trace", "vocabulary"},
}


def import_graph() -> dict[str, set[str]]:
    """Top-level unit (module or sub-package of speclimits) -> the units it imports: :func:`file_graph`
    collapsed onto the units (``from speclimits import paper`` counts too)."""
    def unit(name: str) -> str:
        return name.split(".")[1] if "." in name else "__init__"

    graph: dict[str, set[str]] = defaultdict(set)
    for name, targets in file_graph().items():
        graph[unit(name)].update(unit(t) for t in targets if unit(t) != unit(name))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by depth-first search (each reported once, from its first node reached)."""
    found, state, stack = [], {}, []

    def visit(u: str) -> None:
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def file_graph() -> dict[str, set[str]]:
    """Module file -> the module files it imports, deferred imports included; a name imported from a package
    counts as its submodule when it is one, else as the package's ``__init__``."""
    files = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # a relative import
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    if target in files and target != name:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in files and a.name != name)
    return graph


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_package_imports_one_above_it():
    graph = import_graph()
    assert {"trace", "tracing", "stats", "oracle", "control", "book", "linguistic"} <= set(graph)
    assert cycles(graph) == []


def test_the_low_layers_import_only_what_is_below_them():
    graph = import_graph()
    bad = {unit: sorted(graph[unit] - allowed) for unit, allowed in ALLOWED.items() if graph[unit] - allowed}
    assert bad == {}


def test_no_module_file_imports_one_that_imports_it_back():
    """No circle between files either (a deferred import inside a function hides one from Python, not
    from a reader following the code)."""
    assert cycles(file_graph()) == []
