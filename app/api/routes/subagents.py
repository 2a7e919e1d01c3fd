"""A thread's registry of subagents (§6.5)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from app import children, threads
from app.api import bodies, schemas
from app.api.deps import CurrentUser, SessionDep

router = APIRouter(tags=["subagents"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


@router.get("/threads/{thread_id}/subagents", operation_id="listSubagents", responses=ERRORS)
async def list_subagents(thread_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.SubagentList:
    """The thread's children, oldest first, with their registry status."""
    thread = await threads.get(session, thread_id, who)
    rows = await children.listed_by_id(session, thread.id)
    return schemas.SubagentList(subagents=[schemas.SubagentEntry.model_validate(children.entry(r)) for r in rows])
