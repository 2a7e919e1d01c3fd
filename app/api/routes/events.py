"""The event streams (SSE): a thread's events, and the lifecycle of the caller's threads.

Both replay stored events after `Last-Event-ID` (or `since`), then follow live ones, with no gap and no duplicate:
the stream subscribes first, then reads the backlog, and drops notifications it has already passed.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Header, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sse_starlette import EventSourceResponse, ServerSentEvent

from app import events, threads
from app.api import schemas
from app.api.deps import CurrentUser, sessions
from app.events import Live, Overflow, Stored

router = APIRouter(tags=["events"])

KEEPALIVE_SECONDS = 15
PAGE = 500  # stored events read per query
RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}},
    401: {"model": schemas.Error},
    404: {"model": schemas.Error},
}


class Row(Protocol):
    seq: int
    type: str
    data: dict[str, Any]


Reader = Callable[[AsyncSession, int, int], Awaitable[Sequence[Row]]]
Missed = Callable[[AsyncSession, int], Awaitable[int | None]]
Visible = Callable[[str, dict[str, Any]], bool]


def _visible(include_silent: bool, depth: int, reasoning: bool) -> Visible:
    def visible(type_: str, data: dict[str, Any]) -> bool:
        if int(data.get("depth", 0) or 0) > depth:
            return False
        if type_ == "reasoning_chunk" and not reasoning:
            return False
        return not (type_ == "message_data" and data.get("data", {}).get("silent") and not include_silent)

    return visible


def _start(since: int | None, last_event_id: str | None) -> int:
    """Where to resume: `Last-Event-ID` (a seq) wins over `since`; anything else starts at the beginning."""
    value = (last_event_id or "").strip()
    if value.isascii() and value.isdigit() and len(value) < 19:  # anything else (even "²") is not a seq
        return int(value)
    return since or 0


def _response(
    request: Request,
    key: uuid.UUID,
    after: int,
    read: Reader,
    missed: Missed,
    visible: Visible,
) -> EventSourceResponse:
    factory: async_sessionmaker[AsyncSession] = sessions(request)
    hub: events.Hub = request.app.state.hub

    async def backlog(position: int) -> Sequence[Row]:
        async with factory() as session:
            return await read(session, position, PAGE)

    async def generate() -> AsyncIterator[ServerSentEvent]:
        position = after
        sub = hub.subscribe(key)  # subscribe first, then read the backlog: nothing falls between
        try:
            async with factory() as session:
                oldest = await missed(session, position)
            if oldest is not None:  # retention removed part of what was asked for: say so, then go on
                yield ServerSentEvent(event="events_missed", data=json.dumps({"oldest_seq": oldest}))
            while True:
                # shielded: a client hanging up mid-query must not cost the pool its connection
                rows = await asyncio.shield(backlog(position))
                for row in rows:
                    position = row.seq
                    if visible(row.type, row.data):
                        yield ServerSentEvent(id=str(row.seq), event=row.type, data=json.dumps(row.data))
                if len(rows) == PAGE:
                    continue  # a full page: more may be stored; anything later is notified
                item = await sub.get()
                while isinstance(item, Live) or (isinstance(item, Stored) and item.seq <= position):
                    if isinstance(item, Live) and visible(item.type, item.data):
                        yield ServerSentEvent(event=item.type, data=json.dumps(item.data))
                    item = await sub.get()
        except Overflow:
            return  # the client resumes with Last-Event-ID
        finally:
            hub.unsubscribe(sub)

    return EventSourceResponse(generate(), ping=KEEPALIVE_SECONDS, headers={"X-Accel-Buffering": "no"})


@router.get("/threads/{thread_id}/events", response_class=EventSourceResponse, responses=RESPONSES)
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
    """Stored events of the thread after `Last-Event-ID` (or `since`), then live ones."""
    async with sessions(request)() as session:
        await threads.get(session, thread_id, who)

    async def read(session: AsyncSession, after: int, limit: int) -> Sequence[Row]:
        return await events.read(session, thread_id, after, limit)

    async def missed(session: AsyncSession, after: int) -> int | None:
        return await events.missed(session, thread_id, after)

    visible = _visible(include_silent, depth, reasoning)
    return _response(request, thread_id, _start(since, last_event_id), read, missed, visible)


@router.get("/events", response_class=EventSourceResponse, responses=RESPONSES)
async def lifecycle(
    request: Request,
    who: CurrentUser,
    since: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    """`thread_created`, `thread_updated`, `thread_deleted` for the caller's threads (every thread for an admin)."""
    user = None if who.admin else who.user_id

    async def read(session: AsyncSession, after: int, limit: int) -> Sequence[Row]:
        return await events.read_lifecycle(session, user, after, limit)

    return _response(
        request, events.LIFECYCLE, _start(since, last_event_id), read, events.missed_lifecycle, lambda *_: True
    )
