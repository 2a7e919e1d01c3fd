"""The layers of ARCHITECTURE.md: what each part of `app/` may import, read from every module's imports, and no
import cycle anywhere in `app/`."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"

# module prefix -> prefixes it must never import (lazy imports inside functions count too)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "app.spec": ("app.llm", "app.catalog", "app.engine", "app.api", "app.worker", "app.runtime", "app.db"),
    "app.llm": ("app.catalog", "app.engine", "app.api", "app.worker", "app.runtime", "app.db", "app.tables"),
    "app.catalog": ("app.engine", "app.api", "app.worker", "app.runtime", "app.db", "app.tables"),
    # the engine's value types and argument texts sit under every other engine module: they import none of them
    "app.engine.types": ("app.engine", "app.api", "app.worker", "app.runtime", "app.__main__"),
    "app.engine.tool_arguments": ("app.engine", "app.api", "app.worker", "app.runtime", "app.__main__"),
    "app.engine": ("app.api", "app.worker", "app.runtime", "app.__main__"),
    "app.api": ("app.engine.", "app.worker"),  # the engine's package functions only, never its modules
    "app.worker": ("app.api", "app.runtime", "app.__main__"),
}
STORAGE_FORBIDDEN = ("app.engine", "app.api", "app.worker", "app.runtime", "app.__main__")
ENTRY = {"app.runtime", "app.__main__"}  # the composition root and the CLI may import anything
# the storage modules that build on each other, lowest first: each imports none named after it (issue 31)
STORAGE_ORDER = (
    "app.tables",
    "app.db",
    "app.statements",
    "app.events",
    "app.claims",
    "app.threads",
    "app.queue",
    "app.messages",
    "app.changes",
    "app.files",
    "app.children",
    "app.control",
)


# the engine's modules, lowest first (issue 31): each imports engine modules of the layers before its own only, so
# the graph is one-way; a new engine module is declared here
ENGINE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("types", "tool_arguments", "tally", "transcript"),  # value types, argument texts, what a turn took; the history
    ("stops", "history", "handoffs", "child_tools", "files", "tools", "calls", "step"),  # decisions, a tool, the model
    ("turns", "context", "transactions"),  # an execution's transactions on its thread row
    ("hooks",),  # over `spec.ThreadState`: nothing from `state`
    ("edits", "results", "pipeline"),  # a message edit; a tool result; a step's request and its answer stored
    ("messages",),
    ("schedule", "variables", "tool_queue"),  # the state's effect and variable methods; `queue_tool`
    ("state",),  # `RunState` and its one factory
    ("subprompts", "effect_runs", "inbox"),
    ("tool_phase",),
    ("run",),
    ("__init__",),  # the package: what the API and the worker use
)


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
    return {name for name in found if name == "app" or name.startswith("app.")}


def _matches(name: str, forbidden: str) -> bool:
    """`app.engine.` forbids the package's modules (not the package); `app.engine` forbids both."""
    return name.startswith(forbidden) if forbidden.endswith(".") else _under(name, forbidden)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _rules(module: str) -> tuple[str, ...]:
    if module in ENTRY:
        return ()
    for prefix, forbidden in FORBIDDEN.items():
        if _under(module, prefix):
            return forbidden
    return STORAGE_FORBIDDEN  # the storage modules: app/*.py


MODULES = sorted(APP.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_imports_only_what_its_layer_may(path: Path) -> None:
    module = _name(path)
    forbidden = _rules(module)
    wrong = sorted(
        i for i in _imports(path) if any(i.startswith(f) if f.endswith(".") else _under(i, f) for f in forbidden)
    )
    assert not wrong, f"{module} imports {wrong}: see ARCHITECTURE.md's layers"


@pytest.mark.parametrize("module", STORAGE_ORDER)
def test_storage_modules_import_only_those_below_them(module: str) -> None:
    above = STORAGE_ORDER[STORAGE_ORDER.index(module) + 1 :]
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    wrong = sorted(i for i in _imports(path) if any(_under(i, a) for a in above))
    assert not wrong, f"{module} imports {wrong}, which build on it: see ARCHITECTURE.md's layers"


def test_the_rules_catch_a_forbidden_import(tmp_path: Path) -> None:
    """The check itself: a storage module importing the engine is found."""
    assert any(i.startswith("app.engine") for i in _imports_of("from app.engine import run\n", tmp_path))
    assert _rules("app.messages") == STORAGE_FORBIDDEN and _rules("app.engine.run") == FORBIDDEN["app.engine"]
    assert "app.engine.context" in _imports_of("from app.engine import context\n", tmp_path)
    assert _rules("app.engine.types") == FORBIDDEN["app.engine.types"]


def _imports_of(source: str, tmp_path: Path) -> set[str]:
    file = tmp_path / "m.py"
    file.write_text(source)
    return _imports(file)


# -- the engine's order ---------------------------------------------------------------------------------------


def _engine_name(module: str) -> str | None:
    """`app.engine.x` → `x`, the package → `__init__`, anything else → None."""
    if module == "app.engine":
        return "__init__"
    return module.removeprefix("app.engine.") if module.startswith("app.engine.") else None


def _layer(name: str) -> int | None:
    return next((n for n, layer in enumerate(ENGINE_LAYERS) if name in layer), None)


def _engine_upward(module: str, imported: set[str]) -> list[str]:
    """The engine modules `module` imports that are not in a layer below its own."""
    name = _engine_name(module)
    assert name is not None and _layer(name) is not None, f"{module}: declare its layer in ENGINE_LAYERS"
    own = _layer(name)
    wrong = []
    for other in sorted(imported):
        other_name = _engine_name(other)
        if other_name is None or other == module:
            continue
        layer = _layer(other_name)
        if layer is None or own is None or layer >= own:
            wrong.append(other)
    return wrong


ENGINE = sorted(m for m in (_name(p) for p in MODULES) if _engine_name(m) is not None)


@pytest.mark.parametrize("module", ENGINE)
def test_engine_modules_import_only_the_layers_below_them(module: str) -> None:
    wrong = _engine_upward(module, _app_graph()[module])
    assert not wrong, f"{module} imports {wrong}, declared at or above it in ENGINE_LAYERS (ARCHITECTURE.md)"


def test_the_engine_order_catches_an_upward_import() -> None:
    assert _engine_upward("app.engine.hooks", {"app.engine.state"}) == ["app.engine.state"]
    assert _engine_upward("app.engine.tools", {"app.engine.tools", "app.engine.types"}) == []
    assert _engine_upward("app.engine.state", {"app.engine.hooks", "app.engine.subprompts"}) == [
        "app.engine.subprompts"
    ]
    assert _engine_upward("app.engine.stops", {"app.engine.history"}) == ["app.engine.history"]  # a peer too
    with pytest.raises(AssertionError, match="declare its layer"):
        _engine_upward("app.engine.undeclared", set())


# -- no import cycle ------------------------------------------------------------------------------------------
#
# Every import counts: at the top, inside functions, and under `if TYPE_CHECKING:` (a one-way graph needs none back
# up). Relative imports are resolved; `from package import name` is the module `package.name` when there is one.


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _module_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that module `name` (at `path`) imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # `app.x.Y` → `app.x`
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                add(full if full in known else base)
    return found


def _graph(root: Path) -> dict[str, set[str]]:
    known = _modules(root)
    return {name: _module_imports(name, path, known) for name, path in known.items()}


@functools.cache
def _app_graph() -> dict[str, set[str]]:
    return _graph(APP)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def _chain(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One import chain around a cycle: from its first module back to it, through the component only."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return component


def test_no_import_cycle_in_app() -> None:
    graph = _app_graph()
    found = _cycles(graph)
    assert not found, "import cycles (imports inside functions and under TYPE_CHECKING count):\n" + "\n".join(
        " → ".join(_chain(graph, c)) for c in found
    )


def test_the_cycle_check_finds_hidden_imports(tmp_path: Path) -> None:
    """A cycle closed by an import inside a function, or under `if TYPE_CHECKING:`, or a relative one, is found."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (package / "d.py").write_text("from pkg.a import thing\n")  # into the cycle, not part of it
    graph = _graph(package)
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.a"}
    assert _cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert _chain(graph, ["pkg.a", "pkg.c", "pkg.sub.b"]) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (package / "c.py").write_text("")
    assert _cycles(_graph(package)) == []
