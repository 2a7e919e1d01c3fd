"""The thread event stream (SSE): replay stored events after a seq, then follow live ones."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sse_starlette import EventSourceResponse, ServerSentEvent

from app import events, tables, threads
from app.api import schemas
from app.api.deps import CurrentUser, sessions
from app.events import Live, Overflow, Stored

router = APIRouter(tags=["events"])

KEEPALIVE_SECONDS = 15
PAGE = 500  # stored events read per query


def _visible(type_: str, data: dict[str, Any], include_silent: bool, depth: int, reasoning: bool) -> bool:
    if int(data.get("depth", 0) or 0) > depth:
        return False
    if type_ == "reasoning_chunk" and not reasoning:
        return False
    return not (type_ == "message_data" and data.get("data", {}).get("silent") and not include_silent)


async def _backlog(factory: async_sessionmaker[AsyncSession], thread_id: uuid.UUID, after: int) -> list[tables.Event]:
    async with factory() as session:
        return await events.read(session, thread_id, after, PAGE)


@router.get(
    "/threads/{thread_id}/events",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {}}},
        401: {"model": schemas.Error},
        404: {"model": schemas.Error},
    },
)
async def stream(
    thread_id: uuid.UUID,
    request: Request,
    who: CurrentUser,
    since: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    include_silent: bool = False,
    depth: Annotated[int, Query(ge=0, le=100)] = 0,
    reasoning: bool = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """Stored events after `Last-Event-ID` (or `since`), then live ones: no gap, no duplicate."""
    factory = sessions(request)
    async with factory() as session:
        await threads.get(session, thread_id, who)
    after = since or 0
    resume = (last_event_id or "").strip()
    if resume.isascii() and resume.isdigit() and len(resume) < 19:  # anything else (even "²") is not a seq
        after = int(resume)
    hub: events.Hub = request.app.state.hub

    async def generate() -> AsyncIterator[ServerSentEvent]:
        nonlocal after
        sub = hub.subscribe(thread_id)  # subscribe first, then read the backlog: nothing falls between
        try:
            while True:
                # shielded: a client hanging up mid-query must not cost the pool its connection
                backlog = await asyncio.shield(_backlog(factory, thread_id, after))
                for row in backlog:
                    after = row.seq
                    if _visible(row.type, row.data, include_silent, depth, reasoning):
                        yield ServerSentEvent(id=str(row.seq), event=row.type, data=json.dumps(row.data))
                if len(backlog) == PAGE:
                    continue  # a full page: more may be stored; otherwise later events are all notified
                item = await sub.get()
                while isinstance(item, Live) or (isinstance(item, Stored) and item.seq <= after):
                    if isinstance(item, Live) and _visible(item.type, item.data, include_silent, depth, reasoning):
                        yield ServerSentEvent(event=item.type, data=json.dumps(item.data))
                    item = await sub.get()
        except Overflow:
            return  # the client resumes with Last-Event-ID
        finally:
            hub.unsubscribe(sub)

    return EventSourceResponse(generate(), ping=KEEPALIVE_SECONDS, headers={"X-Accel-Buffering": "no"})
