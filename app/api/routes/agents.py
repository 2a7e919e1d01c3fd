"""The catalog, as clients see it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from app.api import bodies, schemas
from app.api.deps import CatalogDep, CurrentUser, SettingsDep
from app.catalog import Catalog, references
from app.settings import Settings
from app.spec import AgentDefinition
from app.spec.definitions import SideConfig, ToolEntry

router = APIRouter(tags=["agents"], route_class=bodies.Route)


def icon_url(icon: str | None, base: str) -> str | None:
    """An icon as the API returns it: an absolute path (`/icons/boss.svg`) as a full URL on `base`; a URL, a
    protocol-relative URL (`//cdn…`), a relative path or any other text (an emoji) as it is (spec
    `AgentDefinition.icon`: "Absolute paths (starting with `/`) are converted to full URLs in API responses")."""
    if icon is not None and icon.startswith("/") and not icon.startswith("//"):
        return base.rstrip("/") + icon
    return icon


def _base(request: Request, settings: Settings) -> str:
    """The server's address as clients reach it: `PUBLIC_URL`, else the request's base URL (`root_path` included)."""
    return settings.public_url or str(request.base_url)


def _summary(catalog: Catalog, agent: AgentDefinition, base: str) -> dict[str, object]:
    return {
        "name": agent.name,
        "type": agent.type,
        "title": agent.title,
        "description": agent.description or agent.tool_description,
        "icon": icon_url(agent.icon, base),
        "expose_as_tool": agent.expose_as_tool,
        "variables": [
            v.model_dump(include={"name", "type", "required", "scoped", "description"})
            for v in catalog.variables_of_agent(agent.name)
        ],
    }


@router.get("/agents", operation_id="listAgents")
async def list_agents(
    request: Request, catalog: CatalogDep, settings: SettingsDep, _: CurrentUser
) -> list[schemas.Agent]:
    """Every agent of the catalog."""
    base = _base(request, settings)
    return [schemas.Agent.model_validate(_summary(catalog, a, base)) for a in catalog.agents.values()]


@router.get("/agents/{name}", operation_id="getAgent", responses={404: {"model": schemas.Error}})
async def get_agent(
    name: Annotated[str, Path(max_length=schemas.AGENT_CHARS)],
    request: Request,
    catalog: CatalogDep,
    settings: SettingsDep,
    _: CurrentUser,
) -> schemas.AgentDetail:
    """One agent and its shape: its sides (how each turn stops), and each prompt it runs with its model, hooks and
    tools (callables, subprompts, subagents with their modes, handoffs)."""
    agent = catalog.agent(name)
    sides = [s for s in (agent.side_a, agent.side_b) if s is not None]
    prompts = sorted({s.prompt for s in sides})
    return schemas.AgentDetail.model_validate(
        {
            **_summary(catalog, agent, _base(request, settings)),
            "side_a": _side(agent.side_a),
            "side_b": _side(agent.side_b) if agent.side_b else None,
            "prompts": prompts,
            "max_session_turns": agent.max_session_turns,
            "hooks": agent.hooks or [],
            "prompt_details": [_prompt(catalog, agent, p) for p in _reached(catalog, prompts)],
        }
    )


def _side(side: SideConfig) -> dict[str, object]:
    bindings = {which: side.binding(which) for which in ("stop", "fail", "status")}
    return {
        "label": side.label,
        "prompt": side.prompt,
        "stop_on_response": side.stop_on_response,
        "stop_tool": side.stop_tool,
        "max_steps": side.max_steps,
        "session_tools": {which: b.name for which, b in bindings.items() if b is not None},
    }


def _reached(catalog: Catalog, roots: list[str]) -> list[str]:
    """`roots`, then the subprompts they call, breadth first, each once (a subagent's prompts are its own map's)."""
    order, queue = list(roots), list(roots)
    while queue:
        for entry in catalog.prompts[queue.pop(0)].tool_entries():
            if entry.name in catalog.prompts and entry.name not in order:
                order.append(entry.name)
                queue.append(entry.name)
    return order


def _prompt(catalog: Catalog, agent: AgentDefinition, name: str) -> dict[str, object]:
    prompt = catalog.prompts[name]
    return {
        "name": name,
        "model": prompt.model,
        "description": prompt.tool_description,
        "include_chat": prompt.include_chat,
        "includes": references.included(prompt),
        "hooks": prompt.hooks if prompt.hooks is not None else agent.hooks or [],
        "tools": [_link(catalog, entry) for entry in prompt.tool_entries()],
    }


def _link(catalog: Catalog, entry: ToolEntry) -> dict[str, object]:
    target = catalog.agents.get(entry.name)
    subagent = target is not None and target.type == "dual_ai"
    description: str | None
    if entry.name in catalog.tools:
        kind, description = "tool", catalog.tools[entry.name].description
    elif entry.name in catalog.prompts:
        kind, description = "subprompt", catalog.prompts[entry.name].tool_description
    else:
        kind = "subagent" if subagent else "handoff"
        description = target.tool_description if target else None
    return {
        "name": entry.name,
        "kind": kind,
        "description": description,
        "optional": entry.optional,
        "blocking": entry.blocking if subagent else None,
        "resumable": entry.resumable is not False if subagent else None,
        "immediate": entry.immediate is not False if subagent else None,
    }
