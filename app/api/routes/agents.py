"""The catalog, as clients see it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from app.api import bodies, schemas
from app.api.deps import CatalogDep, CurrentUser, SettingsDep
from app.catalog import Catalog
from app.settings import Settings
from app.spec import AgentDefinition

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
    """One agent with its sides and prompt names."""
    agent = catalog.agent(name)
    sides = [s for s in (agent.side_a, agent.side_b) if s is not None]
    return schemas.AgentDetail.model_validate(
        {
            **_summary(catalog, agent, _base(request, settings)),
            "side_a": {"label": agent.side_a.label, "prompt": agent.side_a.prompt},
            "side_b": {"label": agent.side_b.label, "prompt": agent.side_b.prompt} if agent.side_b else None,
            "prompts": sorted({s.prompt for s in sides}),
        }
    )
