"""The references between definitions (models, prompts, agents, tools, hooks): each must name something defined
and fit it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Protocol

from app.catalog.problems import Problem
from app.spec.define import HookDefinition, ToolDefinition
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


class Definitions(Protocol):
    """What the checks read of a `Catalog` (the package imports this module, never the other way round)."""

    @property
    def models(self) -> Mapping[str, ModelDefinition]: ...
    @property
    def prompts(self) -> Mapping[str, PromptDefinition]: ...
    @property
    def agents(self) -> Mapping[str, AgentDefinition]: ...
    @property
    def tools(self) -> Mapping[str, ToolDefinition]: ...
    @property
    def hooks(self) -> Mapping[str, HookDefinition]: ...


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
_ENTRY_FIELDS = {  # what a `tools` entry is → the object-form fields that fit it
    "callable": CALLABLE_FIELDS,
    "subprompt": SUBPROMPT_FIELDS,
    "subagent": SUBAGENT_FIELDS,
    "handoff": HANDOFF_FIELDS,
}


def check(c: Definitions, origins: Mapping[tuple[str, str], str]) -> list[Problem]:
    """The reference checks of `authoring.md` (Agents), each problem placed in its definition's file."""
    checks: list[tuple[str, Mapping[str, Any], Callable[[Definitions, Any], Iterator[Problem]]]] = [
        ("tools", c.tools, _check_tool),
        ("models", c.models, _check_model),
        ("prompts", c.prompts, _check_prompt),
        ("agents", c.agents, _check_agent),
    ]
    return [
        replace(p, file=origins[(kind, name)])
        for kind, defs, fn in checks
        for name, d in defs.items()
        for p in fn(c, d)
    ]


def included(prompt: PromptDefinition) -> list[str]:
    """The prompts that `prompt` includes, in order."""
    return [part.prompt for part in _parts(prompt) if isinstance(part, PromptIncludePart)]


def _check_tool(c: Definitions, tool: ToolDefinition) -> Iterator[Problem]:
    if tool.name in RESERVED:
        yield Problem("", "", f"`{tool.name}` is a reserved tool name", "rename the file")


def _check_model(c: Definitions, model: ModelDefinition) -> Iterator[Problem]:
    for i, fallback in enumerate(model.fallbacks):
        if fallback == model.name:
            yield Problem("", f"fallbacks[{i}]", "a model cannot fall back to itself", f"remove `{fallback}`")
        elif fallback not in c.models:
            yield _unknown(f"fallbacks[{i}]", "model", fallback, c.models)


def _check_prompt(c: Definitions, prompt: PromptDefinition) -> Iterator[Problem]:
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


def _check_entry(c: Definitions, where: str, entry: ToolEntry) -> Iterator[Problem]:
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


def _check_hooks(c: Definitions, hooks: list[str] | None) -> Iterator[Problem]:
    for i, hook in enumerate(hooks or []):
        if hook not in c.hooks:
            yield _unknown(f"hooks[{i}]", "hook", hook, c.hooks)


def _check_agent(c: Definitions, agent: AgentDefinition) -> Iterator[Problem]:
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


def _variables(c: Definitions) -> Iterator[VariableDefinition]:
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


def _include_path(c: Definitions, start: str, goal: str, seen: set[str]) -> list[str] | None:
    """A chain of includes leading from prompt `start` to prompt `goal`."""
    if start == goal:
        return [goal]
    seen.add(start)
    for name in included(c.prompts[start]):
        if name not in c.prompts or name in seen:
            continue
        if (rest := _include_path(c, name, goal, seen)) is not None:
            return [start, *rest]
    return None
