"""What the broker imports is what it declares: every third-party module that ``broker/`` and
``workers/`` import comes from a distribution ``pyproject.toml`` names, and the installed
version of each declared dependency is within the range declared (the range the suite
runs against)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
OWN = {"broker", "workers"}


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    return {_normal(r.name): r for r in requirements if r.marker is None or r.marker.evaluate()}


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def _imported() -> set[str]:
    """The top-level modules imported at any depth by the broker's and workers' code."""
    names: set[str] = set()
    for package in OWN:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - OWN - set(sys.stdlib_module_names)


def test_every_third_party_import_is_declared() -> None:
    declared = _declared()
    # The extras, imported only where they are installed: `otel`, `postgres`.
    optional = {"opentelemetry", "asyncpg"}
    distributions = metadata.packages_distributions()
    undeclared = {
        module: distributions.get(module)
        for module in _imported() - optional
        if not any(_normal(d) in declared for d in distributions.get(module, []))
    }
    assert not undeclared, f"imported, not declared in pyproject.toml: {undeclared}"


def test_mcp_types_is_declared_with_the_major_the_suite_runs() -> None:
    requirement = _declared()["mcp-types"]
    assert requirement.specifier.contains(metadata.version("mcp-types"))
    assert not requirement.specifier.contains("3.0")  # a new major is checked first


def test_every_installed_dependency_is_within_its_declared_range() -> None:
    outside = {
        name: metadata.version(name)
        for name, requirement in _declared().items()
        if not requirement.specifier.contains(metadata.version(name), prereleases=True)
    }
    assert not outside, f"installed outside the ranges pyproject.toml declares: {outside}"
