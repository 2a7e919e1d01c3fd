"""The scoped-variable bootstrap flow (§6.7): what a deferred subagent still needs, and providing it."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from app import environment, threads, variable_requests
from app.api import bodies, schemas
from app.api.deps import CatalogDep, CurrentUser, EnvLimits, FernetDep, SessionDep

router = APIRouter(tags=["variables"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


@router.get("/threads/{thread_id}/variables/{request_id}", operation_id="getVariableRequest", responses=ERRORS)
async def get_request(
    thread_id: uuid.UUID, request_id: uuid.UUID, session: SessionDep, who: CurrentUser
) -> schemas.VariableRequest:
    """The names a deferred subagent requires and those still missing (never values)."""
    thread = await threads.get(session, thread_id, who)
    row = await variable_requests.get(session, thread.id, request_id)
    return schemas.VariableRequest(
        request_id=row.id,
        parent_thread_id=row.parent_id,
        agent=row.agent,
        required=row.required,
        missing=row.missing,
        status=row.status,
        child_thread_id=row.child_id,
    )


@router.post(
    "/threads/{thread_id}/variables/{request_id}",
    operation_id="provideVariables",
    responses={**ERRORS, **{status: {"model": schemas.Error} for status in (400, 409, 413, 422)}},
)
async def provide(
    thread_id: uuid.UUID,
    request_id: uuid.UUID,
    body: schemas.VariablesIn,
    session: SessionDep,
    who: CurrentUser,
    catalog: CatalogDep,
    fernet: FernetDep,
    limits: EnvLimits,
) -> schemas.VariablesDone:
    """Provide the missing values: the deferred subagent is created from the original payload and starts; it
    reports to the parent like a non-blocking one. 400 while names are still missing, 409 when used twice, 413
    past the env limits."""
    thread = await threads.get(session, thread_id, who, lock=True)
    environment.check(body.env, limits)
    row = await variable_requests.get(session, thread.id, request_id)
    child = await variable_requests.fulfil(session, catalog, fernet, thread, row, body.env, limits.variables)
    await session.commit()
    return schemas.VariablesDone(request_id=row.id, child_thread_id=child.id, status="success")
