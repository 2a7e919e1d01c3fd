"""Logs: what each LLM request, tool call and hook run of a thread cost and returned."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from app import logs, threads
from app.api import bodies, schemas
from app.api.deps import CurrentUser, SessionDep

router = APIRouter(tags=["logs"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


@router.get("/threads/{thread_id}/logs", operation_id="listLogs", responses=ERRORS)
async def list_logs(
    thread_id: uuid.UUID,
    session: SessionDep,
    who: CurrentUser,
    kind: Literal["llm", "tool", "hook"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: schemas.Cursor = None,
) -> schemas.LogList:
    """The thread's logs, oldest first."""
    thread = await threads.get(session, thread_id, who)
    rows, next_cursor = await logs.page(session, thread.id, kind=kind, limit=limit, cursor=cursor)
    return schemas.LogList(
        logs=[schemas.Log.model_validate(r, from_attributes=True) for r in rows], next_cursor=next_cursor
    )


@router.get("/threads/{thread_id}/logs/{log_id}", operation_id="getLog", responses=ERRORS)
async def get_log(thread_id: uuid.UUID, log_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.LogDetail:
    """One log of the thread, with the whole request its model call was sent when `LOG_REQUESTS=full` kept it."""
    thread = await threads.get(session, thread_id, who)
    return schemas.LogDetail.model_validate(await logs.one(session, thread.id, log_id), from_attributes=True)
