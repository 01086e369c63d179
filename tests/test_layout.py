"""The layout's rules, checked on the source: no import circles, no role importing another.

Every import counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): a circle that only type checking sees still ties the modules
together for whoever reads them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "workers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


MODULES = _modules()


def _imported(name: str, path: Path) -> Iterator[str]:
    """The project modules that module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module pkg.mod where there is one.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]  # ``import a.b.c`` where c is a name
            if target and target != name:
                yield target


GRAPH = {name: sorted(set(_imported(name, path))) for name, path in MODULES.items()}


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in GRAPH[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_project() -> None:
    assert "broker.front.acp.connection" in GRAPH
    assert "broker.protocol.jsonrpc" in GRAPH["broker.front.acp.connection"]
    assert "broker.protocol.commands" in GRAPH["workers.agent_host.worker"]


def test_no_module_imports_itself_back() -> None:
    assert _circles() == []


def _importers(prefix: str, of: str) -> list[tuple[str, str]]:
    return [
        (name, target)
        for name, targets in GRAPH.items()
        if name == prefix or name.startswith(prefix + ".")
        for target in targets
        if target == of or target.startswith(of + ".")
    ]


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("workers", "broker.front"),  # the roles share contracts through protocol/ and store/
        ("broker.protocol", "broker.front"),
        ("broker.store", "broker.front"),
        ("broker.protocol", "workers"),
        ("broker.store", "workers"),
        ("broker.front", "workers"),  # `serve` (broker.serve) puts the roles together
        ("workers.agent_host", "workers.projector"),
        ("workers.projector", "workers.agent_host"),
        ("broker.protocol", "broker.store.client"),  # protocol code is pure: no I/O
        ("broker.protocol", "broker.store.log"),
    ],
)
def test_a_part_does_not_import_what_it_must_not(importer: str, imported: str) -> None:
    assert _importers(importer, imported) == []
