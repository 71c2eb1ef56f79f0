"""The packages of src/trio_kubelet import each other without cycles, and the leaves stay leaves.

A node of the graph is a package (``core``, ``reconcile``, …) or a top-level module (``agent``,
``cli``, ``config``, ``events``); an arrow is any import, lazy ones inside functions included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import trio_kubelet

SRC = Path(trio_kubelet.__file__).parent
PACKAGE = "trio_kubelet"

# What these may import of the project (beyond themselves): nothing that could import them back.
ALLOWED = {
    "core": {"model"},
    "model": set(),
    "events": {"model"},
    # The decision kinds re-decide with the core; the replayer tells them the rest (kinds.Replay).
    "recording": {"core", "model"},
}
# Modules that import nothing of the project at all.
LEAF_MODULES = ["trio_kubelet.recording.records"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[str]:
    """Every project module ``path`` imports, at any depth of its code."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.module


def _node(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else None


def import_graph() -> dict[str, dict[str, set[str]]]:
    """node -> imported node -> the imports that make the arrow ("module -> module")."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        source = _node(_module_name(path))
        if source is None:
            continue
        graph.setdefault(source, {})
        for target in _imports(path):
            node = _node(target)
            if node is not None and node != source:
                graph[source].setdefault(node, set()).add(f"{_module_name(path)} -> {target}")
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _explain(graph: dict[str, dict[str, set[str]]], component: list[str]) -> str:
    arrows = [
        arrow
        for source in component
        for target in component
        for arrow in sorted(graph[source].get(target, ()))
    ]
    return f"cycle between {component}:\n  " + "\n  ".join(arrows)


def test_no_cycles_between_packages() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "\n".join(_explain(graph, component) for component in found)


def test_pure_and_leaf_packages_import_only_below_them() -> None:
    graph = import_graph()
    for node, allowed in ALLOWED.items():
        extra = {target: arrows for target, arrows in graph[node].items() if target not in allowed}
        assert not extra, f"{node} imports {sorted(extra)}: {sorted(set().union(*extra.values()))}"


def test_leaf_modules_import_nothing_of_the_project() -> None:
    for module in LEAF_MODULES:
        path = SRC.parent.joinpath(*module.split(".")).with_suffix(".py")
        imported = [name for name in _imports(path) if _node(name) is not None]
        assert not imported, f"{module} imports {imported}"


def test_the_check_finds_a_cycle() -> None:
    """The check itself: a two-package loop and a three-package loop are both reported."""
    graph: dict[str, dict[str, set[str]]] = {
        "a": {"b": {"a.x -> b.y"}},
        "b": {"a": {"b.y -> a.z"}},
        "c": {"d": set()},
        "d": {"e": set()},
        "e": {"c": set(), "a": set()},
    }
    assert cycles(graph) == [["a", "b"], ["c", "d", "e"]]
