"""The layout's rules, checked on the source: no import circles, no role importing another.

Every import counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): a circle that only type checking sees still ties the modules
together for whoever reads them.
"""

from __future__ import annotations

import ast
import functools
import inspect
import pickle
import re
import subprocess
import sys
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

_PARSE_ALL = """
import ast, pickle, sys
paths = sys.stdin.read().splitlines()
sys.stdout.buffer.write(pickle.dumps({p: ast.parse(open(p).read(), p) for p in paths}))
"""


@functools.cache
def _parsed() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed once, in a child process of its own. CPython 3.11
    counts the AST constructor's recursion depth per interpreter, not per thread: a parse
    here while a thread another test left behind builds a tree too (a traceback it
    formats parses source, for its carets) failed as "SystemError: AST constructor
    recursion depth mismatch" (once in a full run). The child runs no other thread."""
    paths = "\n".join(str(path) for path in MODULES.values())
    done = subprocess.run(
        [sys.executable, "-c", _PARSE_ALL], input=paths.encode(), capture_output=True, check=True
    )
    trees: dict[str, ast.Module] = pickle.loads(done.stdout)
    return trees


def _tree(path: Path) -> ast.Module:
    return _parsed()[str(path)]


def _imported(name: str, path: Path) -> Iterator[str]:
    """The project modules that module ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
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
        ("broker.protocol", "broker.store"),  # protocol code is pure: no I/O, no store
        ("broker.model", "broker.store"),  # the models both use (log events)
        ("broker.model", "broker.protocol"),
        ("broker.store", "broker.protocol"),
    ],
)
def test_a_part_does_not_import_what_it_must_not(importer: str, imported: str) -> None:
    assert _importers(importer, imported) == []


ROLES = ("broker.front", "broker.clients", "workers")
"""The roles: what they need of the store goes through its interfaces (``Store``, the live
feed, the log, the index, the queues), whatever the store's topology."""

TOPOLOGY_MODULES = (
    "broker.store.raw",  # the own client's connections
    "broker.store.connections",
    "broker.store.own_client",
    "broker.store.own_feed",
    "broker.store.direct",
    "broker.store.subscriber",  # the live feed's engines, chosen by broker.store.live
    "broker.store.cluster_feed",
    "broker.store.cluster",
    "broker.store.sentinel",
)
"""Store modules that know one topology: only the store itself imports them."""

TOPOLOGY_NAMES = frozenset(
    {
        "Topology",
        "topology",
        "is_cluster",
        "is_single_server",
        "cluster_client",
        "server_client",
        "open_subscriber",
        "direct_calls",
        "bare_options",
    }
)
"""Names of :mod:`broker.store.client` (and formerly elsewhere) that tell or use the
store's topology."""


def _role_modules() -> list[str]:
    return [n for n in MODULES if any(n == r or n.startswith(r + ".") for r in ROLES)]


@pytest.mark.parametrize("role", ROLES)
def test_a_role_does_not_import_a_topologys_module(role: str) -> None:
    found = [
        (name, target)
        for name in _role_modules()
        if name == role or name.startswith(role + ".")
        for target in GRAPH[name]
        if target in TOPOLOGY_MODULES
    ]
    assert found == []


def test_a_role_does_not_ask_the_stores_topology() -> None:
    found = []
    for name in _role_modules():
        tree = _tree(MODULES[name])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.Attribute):
                names = {node.attr}
            elif isinstance(node, ast.Name):
                names = {node.id}
            else:
                continue
            found += [(name, n) for n in sorted(names & TOPOLOGY_NAMES)]
    assert found == []


# -- the shape of the code ---------------------------------------------------------------------

LIBRARIES = ("websockets", "uvicorn", "redis", "starlette", "h11", "hiredis")
"""Libraries whose internals only :mod:`broker.compat` may lean on."""


def _trees() -> Iterator[tuple[str, ast.Module]]:
    for name, path in MODULES.items():
        yield name, _tree(path)


def _library_imports(tree: ast.Module) -> dict[str, str]:
    """The names a module imports from :data:`LIBRARIES`, and the module each came from."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in LIBRARIES
        ):
            for alias in node.names:
                names[alias.asname or alias.name] = node.module
    return names


def _library_base(base: ast.expr, imported: dict[str, str]) -> str | None:
    """The library class a class statement's base names (``Server`` imported from uvicorn,
    or ``uvicorn.Server``), or None."""
    if isinstance(base, ast.Name):
        return base.id if base.id in imported else None
    if isinstance(base, ast.Attribute):
        root: ast.expr = base
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in LIBRARIES:
            return ast.unparse(base)
    return None


def test_only_the_compat_modules_subclass_a_librarys_classes() -> None:
    # Overriding a library's methods leans on its internals: all of it in broker/compat/,
    # where tests/test_compat_*.py check every internal it assumes.
    found = []
    for name, tree in _trees():
        if name.startswith("broker.compat."):
            continue
        imported = _library_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    base_name = _library_base(base, imported)
                    if base_name and not base_name.endswith(("Error", "Exception", "Closed")):
                        found.append((name, node.name, base_name))
    assert not found


def test_no_module_imports_a_private_name_of_a_library() -> None:
    found = [
        (name, module, alias.name)
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        for module in [node.module]
        if module.split(".")[0] in LIBRARIES
        for alias in node.names
        if alias.name.startswith("_") or any(part.startswith("_") for part in module.split("."))
    ]
    assert found == []


def test_the_compat_modules_import_nothing_of_the_project() -> None:
    assert [
        (name, outside)
        for name, targets in GRAPH.items()
        if name.startswith("broker.compat")
        for outside in [[t for t in targets if not t.startswith("broker.compat")]]
        if outside
    ] == []


TRANSPORT_WRITERS = {
    "broker.front.acp.outbox": "every frame a client is sent",
    "broker.front.acp.keepalive": "the keepalive's Ping frames, the same bytes for all",
    "broker.compat.websockets": "an HTTP refusal, before any WebSocket handshake",
}


def test_only_the_outbox_writes_frames_to_a_clients_socket() -> None:
    writers = {
        name
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "write"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "transport"
    }
    assert writers <= set(TRANSPORT_WRITERS)


MAX_CLASS_METHODS = 30
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 120
MAX_MODULE_LINES = 860


def _is_protocol(node: ast.ClassDef) -> bool:
    """Whether a class is a typing ``Protocol`` (an interface's list: not code to split)."""
    return any(isinstance(base, ast.Name) and base.id == "Protocol" for base in node.bases)


def _classes() -> Iterator[tuple[str, int, int]]:
    for name, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not _is_protocol(node):
                methods = [
                    m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                yield f"{name}.{node.name}", lines, len(methods)


def test_classes_are_small() -> None:
    too_big = []
    for qualified, lines, methods in _classes():
        if lines > MAX_CLASS_LINES or methods > MAX_CLASS_METHODS:
            too_big.append((qualified, lines, methods))
    assert too_big == []


def test_functions_and_modules_are_short() -> None:
    long_functions = [
        (name, node.name, lines)
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for lines in [(node.end_lineno or node.lineno) - node.lineno + 1]
        if lines > MAX_FUNCTION_LINES
    ]
    assert long_functions == []
    long_modules = [
        (name, lines)
        for name, path in MODULES.items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long_modules == []


def test_each_part_of_the_connection_has_its_unit_tests() -> None:
    # Tested by feeding inputs and reading outputs, with no socket and no store.
    tests = Path(__file__).resolve().parent
    for part in ("outbox", "intake", "active"):
        assert (tests / f"test_{part}.py").exists(), part


MOVED = {
    "broker.failures": "broker.errors.failures",
    "broker.store.failures": "broker.errors.store",
}
"""Where errors were described before broker/errors/: no such module comes back."""


def test_errors_are_described_in_one_place() -> None:
    assert not set(MOVED) & set(MODULES)
    assert [(name, old) for name, targets in GRAPH.items() for old in MOVED if old in targets] == []


# -- the store's ports -------------------------------------------------------------------------

STORE_CLIENTS = ("redis", "fakeredis", "hiredis")
"""The store's client libraries: only :mod:`broker.store` (and :mod:`broker.compat`) use them."""

REDIS_COMMANDS = frozenset(
    {
        *("hget", "hset", "hmget", "hgetall", "hexists", "hkeys", "hlen", "hdel", "hincrby"),
        *("zadd", "zrem", "zrange", "zrangebyscore", "zrevrange", "zcard", "zcount", "zscore"),
        *("zremrangebyscore", "sadd", "srem", "smembers", "incrby", "pexpire", "getdel"),
        *("xadd", "xrange", "xrevrange", "xread", "xreadgroup", "xgroup_create", "xack"),
        *("xtrim", "xautoclaim", "xpending", "xpending_range", "xlen", "xinfo_stream"),
        *("xinfo_groups", "spublish", "evalsha", "script_load", "scan_iter"),
        *("execute_command", "register_script", "config_get", "config_set", "flushall"),
    }
)
"""Redis commands as the client libraries name their methods (names nothing else has)."""

GENERIC_COMMANDS = frozenset({"get", "set", "delete", "exists", "expire", "publish", "pipeline"})
"""Redis commands whose names other objects share: counted on a receiver named like a
client (``redis``, ``self.redis``, ``pipe`` …)."""

CLIENT_NAMES = frozenset({"redis", "pipe", "client", "raw", "commands"})


def _outside_the_store() -> Iterator[tuple[str, ast.Module]]:
    for name, tree in _trees():
        if not name.startswith(("broker.store.", "broker.compat.")) and name != "broker.store":
            yield name, tree


def _receiver(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _absolute_imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, list[str]]]:
    """Each absolute import statement of ``tree``, and the modules it names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, [node.module]


def test_only_the_store_imports_its_client_libraries() -> None:
    found = []
    for name, tree in _outside_the_store():
        for _, modules in _absolute_imports(tree):
            found += [(name, m) for m in modules if m.split(".")[0] in STORE_CLIENTS]
    assert found == []


def test_only_the_store_sends_redis_commands() -> None:
    # The roles go through the store's ports (the log, the index, the live feed, the command
    # bus, leases and hosts, idempotency records, rate counters, retention, tokens).
    found = []
    for name, tree in _outside_the_store():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                command = node.func.attr
                if command in REDIS_COMMANDS or (
                    command in GENERIC_COMMANDS and _receiver(node.func.value) in CLIENT_NAMES
                ):
                    found.append((name, node.lineno, ast.unparse(node.func)))
    assert found == []


def test_the_store_raises_no_http_errors() -> None:
    # The HTTP layer's errors (broker.errors: ApiError, ErrorCode) are its own: the store
    # raises its errors, and the HTTP layer maps them (broker.errors.store.query_refused).
    assert [name for name in _modules_in("broker.store") if "broker.errors" in GRAPH[name]] == []


def _modules_in(prefix: str) -> list[str]:
    return [name for name in MODULES if name == prefix or name.startswith(prefix + ".")]


def test_only_the_store_reaches_the_client_behind_a_store() -> None:
    # A role holds a ``Store`` (opaque: ``aclose`` only) and hands it to the ports.
    found = [
        (name, alias.name)
        for name, tree in _outside_the_store()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("store.client")
        for alias in node.names
        if alias.name in ("Commands", "commands")
    ]
    assert found == []


# -- the store's errors and its ports' signatures ----------------------------------------------

CLIENT_ERRORS = ("redis.exceptions", "redis.asyncio.sentinel", "redis.sentinel")
"""Where the store's client library keeps its exception classes."""


def _client_error_imports(root: Path) -> Iterator[tuple[str, int, str]]:
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path)
        if name.startswith(("broker.store", "broker.compat")):
            continue
        for node, modules in _absolute_imports(ast.parse(path.read_text(), str(path))):
            found = [m for m in modules if m.startswith(CLIENT_ERRORS)]
            if modules == ["redis"] and isinstance(node, ast.ImportFrom):
                # ``from redis import ConnectionError``: the same classes
                found += [f"redis.{a.name}" for a in node.names if a.name.endswith("Error")]
            yield from ((name, node.lineno, m) for m in found)


def test_only_the_store_names_its_clients_errors() -> None:
    # A role catches the store's own classes (broker.store.errors: StoreError, StoreUnavailable
    # …), which every port raises for the client's; the benchmarks too (roles' code, run bare).
    found = [
        hit for package in (*PACKAGES, "bench") for hit in _client_error_imports(ROOT / package)
    ]
    assert found == []


def test_the_stores_errors_are_its_own() -> None:
    import importlib

    from redis.exceptions import RedisError

    from broker.store.errors import StoreAway, StoreError

    for name in _modules_in("broker.store"):
        importlib.import_module(name)  # every subclass defined
    kinds, seen = [StoreError], []
    while kinds:
        kind = kinds.pop()
        seen.append(kind)
        kinds += kind.__subclasses__()
    assert len(seen) >= 8
    # The breaker's refusal is raised inside the client's connection, as its connection
    # error too (the client drops the command as on a broken connection): the one exception.
    assert [kind for kind in seen if issubclass(kind, RedisError)] == [StoreAway]


def _ports() -> list[tuple[str, object]]:
    """Every port (:func:`broker.store.boundary.port` classes, ``translated`` functions)."""
    import importlib

    from broker.store.boundary import PORT_MARK

    found = []
    for name in _modules_in("broker.store"):
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if getattr(value, "__module__", None) == name and PORT_MARK in vars(value):
                found.append((f"{name}.{attribute}", value))
    return found


def _public_signatures(port: object) -> Iterator[tuple[str, inspect.Signature]]:
    if not isinstance(port, type):
        yield "", inspect.signature(port)  # type: ignore[arg-type]
        return
    for attribute, member in vars(port).items():
        if callable(member) and (attribute == "__init__" or not attribute.startswith("_")):
            yield f".{attribute}", inspect.signature(member)


def test_the_ports_signatures_say_what_they_take_and_give() -> None:
    ports = dict(_ports())
    assert {"broker.store.bus.CommandBus", "broker.store.log.SessionLog"} <= set(ports)
    assert len(ports) >= 20  # every role's port: a marker lost would empty this test
    vague = []
    for name, port in ports.items():
        for method, signature in _public_signatures(port):
            annotations = [p.annotation for p in signature.parameters.values()]
            annotations.append(signature.return_annotation)
            if any(re.search(r"\bAny\b", str(a)) for a in annotations):
                vague.append(f"{name}{method}")
    assert vague == []
