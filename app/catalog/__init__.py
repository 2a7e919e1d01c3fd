"""Load and validate an agents folder into an immutable `Catalog`; every problem names file, field and fix."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from app import routing
from app.catalog import files, references
from app.catalog.problems import Problem
from app.errors import AgentNotFound, AgentsError
from app.spec.define import EffectDefinition, EndpointDefinition, HookDefinition, ToolDefinition
from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, VariableDefinition

ToolKind = Literal["callable", "prompt", "agent"]


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

    def unresolved(
        self, name: str, provided: Collection[str], *, scoped: bool, values: Mapping[str, str] | None = None
    ) -> list[str]:
        """Required variables of the agent's graph (the scoped ones, or the others) that neither `provided` nor the
        `env` of the definitions around the place that reads them define (§8): a callable sees its agent's, its
        prompt's and its tool entry's `env`; a prompt (a subprompt too) its agent's and its own; a subagent or a
        handoff target starts over with its own agent's `env`, since only the thread env crosses to it. A subagent
        entry whose `optional` flag is off — looked up as a step would: `values` (the stored thread, user and
        instance values), then the agent's and the prompt's `env` — is left out with its graph: a disabled branch
        is not available, so it requires nothing (§6.6)."""
        given = set(provided)
        stored: Mapping[str, str] = values or {}
        missing: set[str] = set()
        seen_prompts: set[tuple[str, frozenset[tuple[str, str]], frozenset[tuple[str, str]]]] = set()
        seen_agents: set[str] = set()
        # a walk with a list of what is still to visit (order does not matter): nested functions calling each other
        # would be a reference cycle per call, garbage for the collector's full passes (issue 36)
        prompts: list[tuple[str, Mapping[str, str], Mapping[str, str]]] = []  # (prompt, agent env, prompt env)
        agents: list[str] = [self.agent(name).name]

        def need(variables: list[VariableDefinition], visible: Collection[str]) -> None:
            for v in variables:
                if v.required and v.scoped == scoped and v.name not in given and v.name not in visible:
                    missing.add(v.name)

        def prompt(node: str, agent_env: Mapping[str, str], prompt_env: Mapping[str, str]) -> None:
            key = (node, frozenset(agent_env.items()), frozenset(prompt_env.items()))
            if key in seen_prompts or node not in self.prompts:
                return
            seen_prompts.add(key)
            definition = self.prompts[node]
            visible = {*agent_env, *prompt_env}
            need(definition.variables, visible)
            for included in references.included(definition):
                prompts.append((included, agent_env, prompt_env))  # rendered with the including prompt's env
            for entry in definition.tool_entries():
                kind = self.kind_of(entry.name)
                if kind == "callable":
                    need(self.tools[entry.name].variables, visible | set(entry.env))
                elif kind == "prompt":
                    prompts.append((entry.name, agent_env, self.prompts[entry.name].env))
                elif kind == "agent" and entry.enabled(lambda n: stored.get(n, agent_env.get(n, prompt_env.get(n)))):
                    agents.append(entry.name)

        def agent(node: str) -> None:
            if node in seen_agents:
                return
            seen_agents.add(node)
            definition = self.agents[node]
            sides = [side for side in (definition.side_a, definition.side_b) if side is not None]
            # the agent's own variables must resolve whichever side's prompt is active
            shared = frozenset.intersection(*(frozenset(self.prompts[s.prompt].env) for s in sides))
            need(definition.variables, {*definition.env, *shared})
            for side in sides:
                side_env = self.prompts[side.prompt].env
                prompts.append((side.prompt, definition.env, side_env))
                for tool in side.session_tool_names():
                    if tool in self.tools:
                        need(self.tools[tool].variables, {*definition.env, *side_env})

        while prompts or agents:
            if prompts:
                prompt(*prompts.pop())
            else:
                agent(agents.pop())
        return sorted(missing)

    def variables_of_agent(self, name: str) -> list[VariableDefinition]:
        """Every variable declared in the agent's graph (`semantics.md` 8), each definition visited once, depth first.

        A walk with a stack, not a nested function calling itself: that function and its closure would be a
        reference cycle per call, garbage for the collector's full passes (a step calls this; issue 36)."""
        found: list[VariableDefinition] = []
        seen: set[tuple[ToolKind, str]] = set()
        todo: list[tuple[ToolKind, str]] = [("agent", self.agent(name).name)]
        while todo:
            kind, node = todo.pop()
            if (kind, node) in seen:
                continue
            seen.add((kind, node))
            below: list[tuple[ToolKind, str]] = []  # visited next, in this order
            if kind == "callable" and node in self.tools:
                found.extend(self.tools[node].variables)
            elif kind == "prompt" and node in self.prompts:
                prompt = self.prompts[node]
                found.extend(prompt.variables)
                below.extend(("prompt", included) for included in references.included(prompt))
                for entry in prompt.tool_entries():
                    if (entry_kind := self.kind_of(entry.name)) is not None:
                        below.append((entry_kind, entry.name))
            elif kind == "agent" and node in self.agents:
                agent = self.agents[node]
                found.extend(agent.variables)
                for side in (agent.side_a, agent.side_b):
                    if side is not None:
                        below.append(("prompt", side.prompt))
                        below.extend(("callable", tool) for tool in side.session_tool_names())
            todo.extend(reversed(below))
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
    defs, origins, problems = files.collect(root)
    proxies = {kind: types.MappingProxyType(d) for kind, d in defs.items()}
    catalog = Catalog(
        root, proxies["models"], proxies["prompts"], proxies["agents"], proxies["tools"], hooks=proxies["hooks"]
    )
    router, route_problems = _routes(defs["endpoints"], origins)
    problems += route_problems
    catalog = replace(catalog, endpoints=router, effects=proxies["effects"])
    if not any(p.severity == "error" for p in problems):  # references mean little while a file is broken
        problems += references.check(catalog, origins)
    return catalog, problems


def _routes(
    defs: Mapping[str, EndpointDefinition], origins: Mapping[tuple[str, str], str]
) -> tuple[routing.Router[EndpointDefinition], list[Problem]]:
    """The endpoints' router; a file whose route is unusable, built-in or taken is a problem."""
    router, refused = routing.build(defs)
    problems = [Problem(origins[("endpoints", name)], exc.field, exc.message, exc.fix) for name, exc in refused]
    return router, problems
