"""The catalog, as clients see it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from app.api import bodies, schemas
from app.api.deps import CatalogDep, CurrentUser
from app.catalog import Catalog
from app.spec import AgentDefinition

router = APIRouter(tags=["agents"], route_class=bodies.Route)


def _summary(catalog: Catalog, agent: AgentDefinition) -> dict[str, object]:
    return {
        "name": agent.name,
        "type": agent.type,
        "title": agent.title,
        "description": agent.description or agent.tool_description,
        "icon": agent.icon,
        "expose_as_tool": agent.expose_as_tool,
        "variables": [
            v.model_dump(include={"name", "type", "required", "scoped", "description"})
            for v in catalog.variables_of_agent(agent.name)
        ],
    }


@router.get("/agents")
async def list_agents(catalog: CatalogDep, _: CurrentUser) -> list[schemas.Agent]:
    """Every agent of the catalog."""
    return [schemas.Agent.model_validate(_summary(catalog, a)) for a in catalog.agents.values()]


@router.get("/agents/{name}", responses={404: {"model": schemas.Error}})
async def get_agent(
    name: Annotated[str, Path(max_length=schemas.AGENT_CHARS)], catalog: CatalogDep, _: CurrentUser
) -> schemas.AgentDetail:
    """One agent with its sides and prompt names."""
    agent = catalog.agent(name)
    sides = [s for s in (agent.side_a, agent.side_b) if s is not None]
    return schemas.AgentDetail.model_validate(
        {
            **_summary(catalog, agent),
            "side_a": {"label": agent.side_a.label, "prompt": agent.side_a.prompt},
            "side_b": {"label": agent.side_b.label, "prompt": agent.side_b.prompt} if agent.side_b else None,
            "prompts": sorted({s.prompt for s in sides}),
        }
    )
