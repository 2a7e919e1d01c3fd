"""Effects: list a thread's scheduled effects and cancel one that has not started (`semantics.md` §10)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter

from app import effects, tables, threads
from app.api import bodies, schemas
from app.api.deps import CurrentUser, SessionDep

router = APIRouter(tags=["effects"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


def view(row: tables.Effect) -> schemas.Effect:
    return schemas.Effect.model_validate(row, from_attributes=True)


@router.get("/threads/{thread_id}/effects", operation_id="listEffects", responses=ERRORS)
async def list_effects(thread_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.EffectList:
    """The thread's effects by due time, whatever their status."""
    thread = await threads.get(session, thread_id, who)
    return schemas.EffectList(effects=[view(r) for r in await effects.list_(session, thread.id)])


@router.post(
    "/threads/{thread_id}/effects/{effect_id}/cancel",
    operation_id="cancelEffect",
    responses={**ERRORS, 409: {"model": schemas.Error}},
)
async def cancel_effect(
    thread_id: uuid.UUID, effect_id: uuid.UUID, session: SessionDep, who: CurrentUser
) -> schemas.Effect:
    """Cancel an effect that has not started (cancelling it again changes nothing); 409 once it started."""
    thread = await threads.get(session, thread_id, who)
    await effects.cancel(session, thread.id, effect_id)
    result = view(await effects.get(session, thread.id, effect_id))
    await session.commit()
    return result
