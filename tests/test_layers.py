"""The layers of ARCHITECTURE.md: what each part of `app/` may import, read from every module's imports."""

from __future__ import annotations

import ast
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
    "app.threads",
    "app.queue",
    "app.messages",
    "app.files",
    "app.children",
    "app.control",
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
