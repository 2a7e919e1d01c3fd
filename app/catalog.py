"""Load and validate an agents folder into an immutable `Catalog`; every problem names file, field and fix."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import sys
import traceback
import types
import typing
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake

from app import routing
from app.errors import AgentNotFound, AgentsError
from app.spec.define import EffectDefinition, EndpointDefinition, HookDefinition, ToolDefinition, collecting
from app.spec.definitions import (
    CALLABLE_FIELDS,
    HANDOFF_FIELDS,
    SUBAGENT_FIELDS,
    SUBPROMPT_FIELDS,
    AgentDefinition,
    ModelDefinition,
    PromptDefinition,
    PromptEnvPart,
    PromptIncludePart,
    ToolEntry,
    VariableDefinition,
)

ToolKind = Literal["callable", "prompt", "agent"]
RESERVED = frozenset({"subagent_create", "subagent_message"})
# Built-in tools a provider runs itself (the spec's "provider tool"): OpenAI's Responses API tools and Anthropic's
# server tools. Not supported (README "Provider tools"): a name of these gets that explanation, not "unknown tool".
PROVIDER_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_fetch",
        "file_search",
        "code_interpreter",
        "code_execution",
        "image_generation",
        "computer_use_preview",
    }
)
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
_ENTRY_FIELDS = {  # what a `tools` entry is → the object-form fields that fit it
    "callable": CALLABLE_FIELDS,
    "subprompt": SUBPROMPT_FIELDS,
    "subagent": SUBAGENT_FIELDS,
    "handoff": HANDOFF_FIELDS,
}
_ROOTS = {m.__name__: m for m in (ModelDefinition, PromptDefinition, AgentDefinition, VariableDefinition)}


@dataclass(frozen=True)
class Problem:
    """One thing wrong (or worth a warning) in the agents folder."""

    file: str
    field: str
    message: str
    fix: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}: " if self.field else f"{self.file}: "
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}{tag}{self.message} — fix: {self.fix}"


class CatalogError(AgentsError):
    """The agents folder is not valid."""

    code = "catalog_invalid"

    def __init__(self, root: Path, problems: list[Problem]) -> None:
        self.problems = problems
        count = f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
        super().__init__(f"{count} in {root}", problems=[str(p) for p in problems])


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: the mappings are not hashable
class Catalog:
    """Every definition of an agents folder, validated and cross-checked."""

    root: Path
    models: Mapping[str, ModelDefinition]
    prompts: Mapping[str, PromptDefinition]
    agents: Mapping[str, AgentDefinition]
    tools: Mapping[str, ToolDefinition]
    hooks: Mapping[str, HookDefinition] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    effects: Mapping[str, EffectDefinition] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    warnings: tuple[Problem, ...] = ()
    endpoints: routing.Router[EndpointDefinition] = dataclasses.field(default_factory=routing.Router)

    def agent(self, name: str) -> AgentDefinition:
        """The agent called `name`."""
        if name not in self.agents:
            raise AgentNotFound(f"Agent `{name}` does not exist")
        return self.agents[name]

    def kind_of(self, name: str) -> ToolKind | None:
        """What a prompt's `tools` entry called `name` refers to."""
        if name in self.tools:
            return "callable"
        if name in self.prompts:
            return "prompt"
        if name in self.agents:
            return "agent"
        return None

    def unresolved(self, name: str, provided: Collection[str], *, scoped: bool) -> list[str]:
        """Required variables of the agent's graph (the scoped ones, or the others) that neither `provided` nor the
        `env` of the definitions around the place that reads them define (§8): a callable sees its agent's, its
        prompt's and its tool entry's `env`; a prompt (a subprompt too) its agent's and its own; a subagent or a
        handoff target starts over with its own agent's `env`, since only the thread env crosses to it."""
        given = set(provided)
        missing: set[str] = set()
        seen: set[tuple[str, str, frozenset[str]]] = set()

        def need(variables: list[VariableDefinition], visible: frozenset[str]) -> None:
            for v in variables:
                if v.required and v.scoped == scoped and v.name not in given and v.name not in visible:
                    missing.add(v.name)

        def prompt(node: str, agent_env: frozenset[str], visible: frozenset[str]) -> None:
            if (node, "prompt", visible) in seen or node not in self.prompts:
                return
            seen.add((node, "prompt", visible))
            definition = self.prompts[node]
            need(definition.variables, visible)
            for part in _parts(definition):
                if isinstance(part, PromptIncludePart):
                    prompt(part.prompt, agent_env, visible)  # rendered with the including prompt's env
            for entry in definition.tool_entries():
                kind = self.kind_of(entry.name)
                if kind == "callable":
                    need(self.tools[entry.name].variables, visible | set(entry.env))
                elif kind == "prompt":
                    prompt(entry.name, agent_env, agent_env | set(self.prompts[entry.name].env))
                elif kind == "agent":
                    agent(entry.name)

        def agent(node: str) -> None:
            if (node, "agent", frozenset()) in seen:
                return
            seen.add((node, "agent", frozenset()))
            definition = self.agents[node]
            agent_env = frozenset(definition.env)
            sides = [side for side in (definition.side_a, definition.side_b) if side is not None]
            # the agent's own variables must resolve whichever side's prompt is active
            shared = frozenset.intersection(*(frozenset(self.prompts[s.prompt].env) for s in sides))
            need(definition.variables, agent_env | shared)
            for side in sides:
                visible = agent_env | set(self.prompts[side.prompt].env)
                prompt(side.prompt, agent_env, visible)
                for tool in side.session_tool_names():
                    if tool in self.tools:
                        need(self.tools[tool].variables, visible)

        agent(self.agent(name).name)
        return sorted(missing)

    def variables_of_agent(self, name: str) -> list[VariableDefinition]:
        """Every variable declared in the agent's graph (`semantics.md` 8), each definition visited once."""
        found: list[VariableDefinition] = []
        seen: set[tuple[str, str]] = set()

        def visit(kind: ToolKind, node: str) -> None:
            if (kind, node) in seen:
                return
            seen.add((kind, node))
            if kind == "callable" and node in self.tools:
                found.extend(self.tools[node].variables)
            elif kind == "prompt" and node in self.prompts:
                prompt = self.prompts[node]
                found.extend(prompt.variables)
                for part in _parts(prompt):
                    if isinstance(part, PromptIncludePart):
                        visit("prompt", part.prompt)
                for entry in prompt.tool_entries():
                    if (entry_kind := self.kind_of(entry.name)) is not None:
                        visit(entry_kind, entry.name)
            elif kind == "agent" and node in self.agents:
                agent = self.agents[node]
                found.extend(agent.variables)
                for side in (agent.side_a, agent.side_b):
                    if side is not None:
                        visit("prompt", side.prompt)
                        for tool in side.session_tool_names():
                            visit("callable", tool)

        visit("agent", self.agent(name).name)
        return found

    def secret_names(self, name: str) -> frozenset[str]:
        """The variables the agent's graph declares `secret`: stored encrypted whoever sets them (§8)."""
        return frozenset(v.name for v in self.variables_of_agent(name) if v.type == "secret")


def empty() -> Catalog:
    """A catalog with nothing in it."""
    none: Mapping[str, Any] = types.MappingProxyType({})
    return Catalog(root=Path(), models=none, prompts=none, agents=none, tools=none)


def check(root: Path) -> list[Problem]:
    """Every problem of the folder at `root`, errors and warnings."""
    return _build(root)[1]


def load(root: Path) -> Catalog:
    """The catalog of the folder at `root`; raises `CatalogError` listing the errors if there are any."""
    catalog, problems = _build(root)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise CatalogError(root, errors)
    return replace(catalog, warnings=tuple(problems))


def _build(root: Path) -> tuple[Catalog, list[Problem]]:
    """Run every file, then (if they all loaded) check the references between definitions."""
    if not root.is_dir():
        fix = "create it (with models/, prompts/, agents/, tools/) or point AGENTS_DIR at it"
        return empty(), [Problem(str(root), "", f"the agents folder `{root}` does not exist", fix)]
    root = root.resolve()
    defs: dict[str, dict[str, Any]] = {kind: {} for kind in _KINDS}
    files: dict[tuple[str, str], str] = {}
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
                if (kind, definition.name) in files:
                    first = files[(kind, definition.name)]
                    message = f"duplicate {noun} `{definition.name}`, also defined in {first}"
                    problems.append(Problem(rel, "name", message, "rename one of them"))
                    continue
                defs[kind][definition.name] = definition
                files[(kind, definition.name)] = rel
    proxies = {kind: types.MappingProxyType(d) for kind, d in defs.items()}
    catalog = Catalog(
        root, proxies["models"], proxies["prompts"], proxies["agents"], proxies["tools"], hooks=proxies["hooks"]
    )
    router, route_problems = _routes(defs["endpoints"], files)
    problems += route_problems
    catalog = replace(catalog, endpoints=router, effects=proxies["effects"])
    if not any(p.severity == "error" for p in problems):  # references mean little while a file is broken
        problems += _cross_check(catalog, files)
    return catalog, problems


# -- custom thread endpoints -------------------------------------------------------------------------------


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


def _routes(
    defs: Mapping[str, EndpointDefinition], files: Mapping[tuple[str, str], str]
) -> tuple[routing.Router[EndpointDefinition], list[Problem]]:
    """The endpoints' router; a file whose route is unusable, built-in or taken is a problem."""
    router, refused = routing.build(defs)
    problems = [Problem(files[("endpoints", name)], exc.field, exc.message, exc.fix) for name, exc in refused]
    return router, problems


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
            problems += _validation_problems(rel, exc)
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


def _validation_problems(rel: str, exc: ValidationError) -> list[Problem]:
    """One problem per error; union branches that did not apply are left out."""
    located = [(*_walk(_ROOTS.get(exc.title), err["loc"]), err) for err in exc.errors()]
    problems: list[Problem] = []
    for path, owner, err in located:
        deeper = any(p != path and (not path or p.startswith((f"{path}.", f"{path}["))) for p, _, _ in located)
        if err["type"] == "missing":  # pydantic names a missing field by its alias
            path = path.removesuffix(_last(path)) + to_snake(_last(path))
        if not deeper and all(p.field != path for p in problems):
            problems.append(Problem(rel, *_explain(path, owner, err)))
    return problems


def _explain(path: str, owner: type[BaseModel] | None, err: Any) -> tuple[str, str, str]:
    """(field, message, fix) for one pydantic error."""
    key, kind, msg, ctx = _last(path), err["type"], err["msg"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        names = [n for f, info in (owner.model_fields.items() if owner else ()) for n in (f, info.alias) if n]
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        return path, f"unknown field `{key}`", f"remove `{key}`{hint}"
    if kind == "missing":
        return path, f"`{key}` is required", f"add `{key}`"
    if kind == "literal_error":
        return path, msg, f"use one of: {str(ctx.get('expected')).replace(' or ', ', ')}"
    if kind == "union_tag_invalid":
        return path, msg, f"use a `type` of: {ctx.get('expected_tags')}"
    if kind == "value_error":  # a rule of a definition's validator, e.g. "a `dual_ai` agent needs `side_b`"
        text = str(ctx.get("error", msg))
        needs = text.partition(" needs ")[2]
        named = [w for w in (needs or text).split("`")[1::2] if owner is None or _field(owner, w)]
        field = path or (named[0] if named else "")
        if needs:
            return field, text, f"add {needs}"
        return field, text, "keep only one of them" if "not both" in text else f"remove `{field}`"
    return path, msg, f"change `{key}`: {msg[:1].lower()}{msg[1:]}"


def _last(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _field(model: type[BaseModel], key: str) -> Any:
    return next((info for f, info in model.model_fields.items() if key in (f, info.alias)), None)


def _walk(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> tuple[str, type[BaseModel] | None]:
    """The field path as the author wrote it (union branch tags dropped) and the model owning its end."""
    path, tp, owner = "", _strip(model), model
    for item in loc:
        if isinstance(item, int):
            path += f"[{item}]"
            args = typing.get_args(tp)
            tp = _strip(args[0]) if args else None
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            owner, info = tp, _field(tp, item)
            path += f".{item}" if path else item
            tp = _strip(info.annotation) if info else None
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = _branch(tp, item)
        else:  # a dict key, or a place we cannot follow
            path += f".{item}" if path else item
            args = typing.get_args(tp)
            tp = _strip(args[1]) if len(args) == 2 else None
    return path, owner


def _strip(tp: Any) -> Any:
    """`tp` without `Annotated` metadata, and without `None` if it is an optional."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if len(members) == 1:
            return _strip(members[0])
    return tp


def _branch(union: Any, tag: str) -> Any:
    """The member of `union` that a pydantic loc tag (class name, discriminator value, `list[...]`) names."""
    for member in map(_strip, typing.get_args(union)):
        if isinstance(member, type) and issubclass(member, BaseModel):
            discriminator = member.model_fields.get("type")
            if member.__name__ == tag or (discriminator and tag in typing.get_args(discriminator.annotation)):
                return member
        elif tag.split("[")[0] == getattr(typing.get_origin(member), "__name__", None):
            return member
    return None


def _cross_check(c: Catalog, files: Mapping[tuple[str, str], str]) -> list[Problem]:
    """The reference checks of `authoring.md` (Agents), each problem placed in its definition's file."""
    checks: list[tuple[str, Mapping[str, Any], Callable[[Catalog, Any], Iterator[Problem]]]] = [
        ("tools", c.tools, _check_tool),
        ("models", c.models, _check_model),
        ("prompts", c.prompts, _check_prompt),
        ("agents", c.agents, _check_agent),
    ]
    return [
        replace(p, file=files[(kind, name)]) for kind, defs, fn in checks for name, d in defs.items() for p in fn(c, d)
    ]


def _check_tool(c: Catalog, tool: ToolDefinition) -> Iterator[Problem]:
    if tool.name in RESERVED:
        yield Problem("", "", f"`{tool.name}` is a reserved tool name", "rename the file")


def _check_model(c: Catalog, model: ModelDefinition) -> Iterator[Problem]:
    for i, fallback in enumerate(model.fallbacks):
        if fallback == model.name:
            yield Problem("", f"fallbacks[{i}]", "a model cannot fall back to itself", f"remove `{fallback}`")
        elif fallback not in c.models:
            yield _unknown(f"fallbacks[{i}]", "model", fallback, c.models)


def _check_prompt(c: Catalog, prompt: PromptDefinition) -> Iterator[Problem]:
    if prompt.name in RESERVED:
        yield Problem("", "name", f"`{prompt.name}` is a reserved tool name", "rename it")
    if prompt.model not in c.models:
        yield _unknown("model", "model", prompt.model, c.models)
    secrets = {v.name for v in _variables(c) if v.type == "secret"}
    for i, part in enumerate(_parts(prompt)):
        if isinstance(part, PromptIncludePart) and part.prompt not in c.prompts:
            yield _unknown(f"prompt[{i}].prompt", "prompt", part.prompt, c.prompts)
        elif isinstance(part, PromptIncludePart):
            cycle = _include_path(c, part.prompt, prompt.name, set())
            if cycle and prompt.name == min(cycle):
                message = f"include cycle: {' → '.join([prompt.name, *cycle])}"
                yield Problem("", f"prompt[{i}].prompt", message, "remove one of these includes")
        elif isinstance(part, PromptEnvPart) and part.property in secrets:
            message = f"`{part.property}` is declared secret, and a secret is never rendered into a prompt"
            fix = "remove this part (tools read secrets with `state.env`), or declare the variable `text`"
            yield Problem("", f"prompt[{i}].property", message, fix)
    for i, entry in enumerate(prompt.tool_entries()):
        yield from _check_entry(c, f"tools[{i}]", entry)
    yield from _check_hooks(c, prompt.hooks)


def _check_entry(c: Catalog, where: str, entry: ToolEntry) -> Iterator[Problem]:
    name = entry.name
    kinds = [k for k, defs in (("tool", c.tools), ("prompt", c.prompts), ("agent", c.agents)) if name in defs]
    if not kinds and name in PROVIDER_TOOLS:
        message = (
            f"`{name}` is a provider-executed tool; this runtime runs only its own tools (callables, subprompts, "
            "subagents, handoffs), so the model never gets provider tools"
        )
        fix = f"write a callable in tools/{name}.py that calls the service you want (README: Provider tools)"
        yield Problem("", where, message, fix)
        return
    if not kinds:
        offerable = {*c.tools, *c.prompts, *(a.name for a in c.agents.values() if a.expose_as_tool)}
        builtin = " (the runtime provides it for resumable subagents)" if name in RESERVED else ""
        fix = f"define it in tools/, prompts/ or agents/, or {_one_of(offerable)}"
        fix += " (provider-executed tools are not supported)"
        yield Problem("", where, f"unknown tool `{name}`{builtin}", fix)
        return
    if len(kinds) > 1:
        fix = "rename one: tools, prompts and agents offered as tools share one namespace"
        yield Problem("", where, f"`{name}` is defined as both a {' and a '.join(kinds)}", fix)
        return
    agent = c.agents.get(name)
    if agent and not agent.expose_as_tool:
        fix = f"set `expose_as_tool=True` and a `tool_description` on agent `{name}`"
        yield Problem("", where, f"agent `{name}` is not exposed as a tool", fix)
        return
    what = {"tool": "callable", "prompt": "subprompt"}.get(kinds[0], "handoff")
    what = "subagent" if agent and agent.type == "dual_ai" else what
    for field in sorted(entry.fields_set - _ENTRY_FIELDS[what]):
        fits = " and ".join(f"{k}s" for k, allowed in _ENTRY_FIELDS.items() if field in allowed)
        fix = f"remove it: `{field}` applies to {fits} only"
        yield Problem("", f"{where}.{field}", f"`{field}` does not fit `{name}`, which is a {what}", fix)


def _check_hooks(c: Catalog, hooks: list[str] | None) -> Iterator[Problem]:
    for i, hook in enumerate(hooks or []):
        if hook not in c.hooks:
            yield _unknown(f"hooks[{i}]", "hook", hook, c.hooks)


def _check_agent(c: Catalog, agent: AgentDefinition) -> Iterator[Problem]:
    if agent.name in RESERVED:
        yield Problem("", "name", f"`{agent.name}` is a reserved tool name", "rename it")
    yield from _check_hooks(c, agent.hooks)
    for which, side in (("a", agent.side_a), ("b", agent.side_b)):
        where, label = f"side_{which}", f"side {which.upper()}"
        if side is None:
            continue
        if side.prompt not in c.prompts:
            yield _unknown(f"{where}.prompt", "prompt", side.prompt, c.prompts)
            continue
        prompt = c.prompts[side.prompt]
        offered = {e.name for e in prompt.tool_entries()} | set(side.session_tool_names())
        if side.stop_tool and side.stop_tool not in offered:
            message = f"stop tool `{side.stop_tool}` is not offered to {label}"
            fix = f"add it to the tools of prompt `{prompt.name}`, or bind it as a session tool of {label}"
            yield Problem("", f"{where}.stop_tool", message, fix)
        for binding in ("stop", "fail", "status"):
            bound = side.binding(binding)
            if bound and (bound.name in c.prompts or bound.name in c.agents):
                message = f"`{bound.name}` is a prompt or an agent, not a callable tool"
                fix = "name a callable tool, or a new name for the runtime's built-in session tool"
                yield Problem("", f"{where}.session_{binding}", message, fix)
        if not prompt.include_chat:
            message = f"prompt `{prompt.name}` has include_chat false: {label} sees only its current turn"
            fix = f"set `include_chat=True` in `{prompt.name}`"
            yield Problem("", f"{where}.prompt", message, fix, "warning")
    if agent.type == "dual_ai" and agent.max_session_turns is None:
        message = "a dual_ai session without `max_session_turns` can run forever"
        yield Problem("", "max_session_turns", message, "set `max_session_turns`", "warning")
    terminal = any(s and (s.session_stop or s.session_fail) for s in (agent.side_a, agent.side_b))
    if agent.type == "dual_ai" and not terminal:
        message = "no side binds `session_stop` or `session_fail`, so only the turn limit ends a session"
        yield Problem("", "", message, "bind a terminal tool on one side", "warning")


def _variables(c: Catalog) -> Iterator[VariableDefinition]:
    yield from (v for p in c.prompts.values() for v in p.variables)
    yield from (v for a in c.agents.values() for v in a.variables)
    yield from (v for t in c.tools.values() for v in t.variables)


def _unknown(field: str, noun: str, name: str, known: Iterable[str]) -> Problem:
    return Problem("", field, f"unknown {noun} `{name}`", f"define it in {noun}s/ or {_one_of(known)}")


def _one_of(names: Iterable[str]) -> str:
    ordered = sorted(names)
    return f"use one of: {', '.join(ordered)}" if ordered else "nothing is defined yet"


def _parts(prompt: PromptDefinition) -> list[Any]:
    return [] if isinstance(prompt.prompt, str) else list(prompt.prompt)


def _include_path(c: Catalog, start: str, goal: str, seen: set[str]) -> list[str] | None:
    """A chain of includes leading from prompt `start` to prompt `goal`."""
    if start == goal:
        return [goal]
    seen.add(start)
    for part in _parts(c.prompts[start]):
        if not isinstance(part, PromptIncludePart) or part.prompt not in c.prompts or part.prompt in seen:
            continue
        if (rest := _include_path(c, part.prompt, goal, seen)) is not None:
            return [start, *rest]
    return None
