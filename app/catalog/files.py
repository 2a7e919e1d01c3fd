"""The definition files of an agents folder: finding them, running them, and keeping what each defines."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.catalog.problems import Problem, from_validation
from app.spec.define import EffectDefinition, EndpointDefinition, HookDefinition, ToolDefinition, collecting
from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition

_KINDS: dict[str, tuple[type, str, str]] = {  # folder → (class, noun, how to define one)
    "models": (ModelDefinition, "model", "define_model(...)"),
    "prompts": (PromptDefinition, "prompt", "define_prompt(...)"),
    "agents": (AgentDefinition, "agent", "define_agent(...)"),
    "tools": (ToolDefinition, "tool", "@define_tool(...) on an async function"),
    "hooks": (HookDefinition, "hook", '@define_hook("<hook name>") on an async function'),
    "endpoints": (EndpointDefinition, "endpoint", "@define_thread_endpoint on an async function"),
    "effects": (EffectDefinition, "effect", "@define_effect(...) on an async function"),
}
_ONE_PER_FILE = ("tools", "hooks", "effects", "endpoints")  # folders whose file name (or path) names the definition
_FOLDERS = {cls: folder for folder, (cls, _, _) in _KINDS.items()}


def collect(root: Path) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], str], list[Problem]]:
    """Run every file of the (resolved) folder at `root`: its definitions by folder and name, the file each came
    from, and the problems found."""
    defs: dict[str, dict[str, Any]] = {kind: {} for kind in _KINDS}
    origins: dict[tuple[str, str], str] = {}
    problems: list[Problem] = []
    package = "agents_catalog._" + hashlib.sha256(str(root).encode()).hexdigest()[:12]
    for kind, (cls, noun, how) in _KINDS.items():
        for path in _sources(root / kind, nested=kind == "endpoints"):
            rel = _relative(path, root)
            found, file_problems = _execute(path, f"{package}.{kind}.{_module(path, root / kind)}", rel)
            problems += file_problems
            if any(p.severity == "error" for p in file_problems):
                continue
            for other in (d for d in found if not isinstance(d, cls)):
                folder = _FOLDERS[type(other)]
                message = f"defines a {_KINDS[folder][1]}, which belongs in {folder}/"
                problems.append(Problem(rel, "", message, f"move it to {folder}/"))
            mine: list[Any] = [d for d in found if isinstance(d, cls)]
            if not mine or (kind in _ONE_PER_FILE and len(mine) > 1):
                fix = f"define one with {how}, or start the file name with `_` if it is a helper"
                problems.append(Problem(rel, "", f"defines {len(mine)} {noun}s", fix))
                continue
            if kind in ("tools", "hooks", "effects"):
                mine[0].name = path.stem  # the file name is the tool name, the hook id, or the effect name
            elif kind == "endpoints":
                mine[0].name = path.relative_to(root / kind).as_posix()  # the file path is the route
            for definition in mine:
                if (kind, definition.name) in origins:
                    first = origins[(kind, definition.name)]
                    message = f"duplicate {noun} `{definition.name}`, also defined in {first}"
                    problems.append(Problem(rel, "name", message, "rename one of them"))
                    continue
                defs[kind][definition.name] = definition
                origins[(kind, definition.name)] = rel
    return defs, origins, problems


def _sources(folder: Path, *, nested: bool) -> list[Path]:
    """The definition files of a folder (of its subfolders too if `nested`); `_` marks a helper file or folder."""
    found = folder.rglob("*.py") if nested else folder.glob("*.py")
    return sorted(p for p in found if not any(part.startswith("_") for part in p.relative_to(folder).parts))


def _module(path: Path, folder: Path) -> str:
    """A module name for the file, unique within its folder (endpoint files nest and have brackets and dots)."""
    rel = path.relative_to(folder).with_suffix("").as_posix()
    if rel.isidentifier():
        return rel
    return "_" + hashlib.sha256(rel.encode()).hexdigest()[:12]


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root.parent).as_posix()
    except ValueError:
        return str(path)


def _execute(path: Path, module_name: str, rel: str) -> tuple[list[object], list[Problem]]:
    """Run one file, collecting the definitions it makes; what it raises or warns becomes problems."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pydantic look the module up
    problems: list[Problem] = []
    with collecting() as found, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            spec.loader.exec_module(module)
        except ValidationError as exc:
            problems += from_validation(rel, exc)
        except SyntaxError as exc:
            message = f"syntax error on line {exc.lineno}: {exc.msg}"
            problems.append(Problem(rel, "", message, "fix the syntax"))
        except Exception as exc:
            lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
            message = f"{type(exc).__name__}{f' on line {lines[-1]}' if lines else ''}: {exc}"
            problems.append(Problem(rel, "", message, "fix the error raised while the file runs"))
    for warning in caught:
        text = str(warning.message)
        field, fix = ("tenvs", "rename `tenvs` to `env`") if "`tenvs`" in text else ("", "heed the warning")
        problems.append(Problem(rel, field, text, fix, "warning"))
    if any(p.severity == "error" for p in problems):
        sys.modules.pop(module_name, None)
    return found, problems
