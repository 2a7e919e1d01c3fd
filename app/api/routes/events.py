"""The event streams (SSE): a thread's events, and the lifecycle of the caller's threads.

Both replay stored events after `Last-Event-ID` (or `since`), then follow live ones, with no gap and no duplicate:
the stream subscribes first, then reads the backlog, and drops notifications it has already passed. A streamed delta
(`message_chunk`, `reasoning_chunk`) is dropped too once the stream has shown its message finished: deltas buffered
while the backlog was read, or announced late, would otherwise follow the message they belong to. A client that
stops reading is dropped once a send has waited `SSE_SEND_TIMEOUT` seconds for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from sqlalchemy.ext.asyncio import AsyncSession
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from app import event_types, events, messages, threads, tokens
from app.api import bodies, frames, schemas
from app.api.deps import CurrentUser, HubDep, RuntimeDep, SessionDep, StreamReader
from app.hub import Batch, Hub, Live, Overflow, Subscription
from app.keys import Principal
from app.runtime import Runtime

log = logging.getLogger(__name__)
router = APIRouter(tags=["events"], route_class=bodies.Route)

KEEPALIVE_SECONDS = 15
FINISHED = 64  # messages a stream remembers as finished; a stale delta belongs to one that finished a moment ago
RESPONSES: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


Reader = Callable[[AsyncSession, int, int], Awaitable[Sequence[events.Row]]]
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


class _EventStream(EventSourceResponse):
    """An `EventSourceResponse` that always ends its HTTP message: at shutdown sse-starlette cancels the stream
    without a last body message, and the client would see a broken chunked response instead of a clean end.

    A send that waits `timeout` seconds for the client to read (any send: events, pings, the last message) drops
    the client: `_watch` times the sends, rather than sse-starlette's `send_timeout` and its cancel scope per send (it
    showed in the fan-out profile), and sse-starlette closes the generator, which releases its subscription."""

    def __init__(self, content: AsyncIterator[ServerSentEvent | bytes], timeout: float) -> None:
        super().__init__(
            content,
            ping=KEEPALIVE_SECONDS,
            headers={"X-Accel-Buffering": "no"},
            data_sender_callable=self._watch,  # run in the response's task group: its error ends the response
        )
        self._timeout = timeout
        self._sending = 0  # sends under way
        self._since = 0.0  # since when some send has been under way

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ended = False
        loop = asyncio.get_running_loop()

        async def tracked(message: Message) -> None:
            nonlocal ended
            ended = ended or (message["type"] == "http.response.body" and not message.get("more_body", False))
            if not self._sending:
                self._since = loop.time()
            self._sending += 1
            try:
                await send(message)
            finally:
                self._sending -= 1

        try:
            await super().__call__(scope, receive, tracked)
        except SendTimeoutError:  # no last message: it would wait as long; the server closes the connection
            log.warning("dropped a stream: its client read nothing for %g s", self._timeout)
            return
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self) -> None:
        """`SendTimeoutError` once a send has been under way for `timeout` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            wait = self._timeout
            if self._sending:
                wait = self._since + self._timeout - loop.time()
                if wait <= 0:
                    raise SendTimeoutError()
            await asyncio.sleep(wait)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        """Send directly: `_watch` applies the timeout."""
        await send(message)


class _Finished:
    """The messages whose last `message_data` a stream has passed was not `pending`: their deltas are stale.

    A delta of a message precedes the message's completion on the hub, so only the few messages that finished while
    the stream subscribed and read its backlog can have stale deltas still to come: the last `FINISHED` are kept."""

    def __init__(self) -> None:
        self._ids: dict[str, None] = {}

    def note(self, type_: str, data: dict[str, Any]) -> None:
        if type_ == "message_data" and data.get("data", {}).get("status") != messages.Status.PENDING:
            key = str(data.get("message_id"))
            self._ids.pop(key, None)
            self._ids[key] = None
            if len(self._ids) > FINISHED:
                del self._ids[next(iter(self._ids))]

    def __contains__(self, live: Live) -> bool:
        return str(live.data.get("message_id")) in self._ids


def _frame(seq: int | None, type_: str, text: str) -> bytes:
    return ServerSentEvent(id=None if seq is None else str(seq), event=type_, data=text).encode()


def _take(
    sub: Subscription, position: int, contiguous: bool, owner: str | None, visible: Visible, finished: _Finished
) -> tuple[list[bytes], int, bool]:
    """The frames of what `sub` has buffered after `position`, the new position, and whether the hub kept up:
    False when an announced event must be read from the log (the hub could not read it, or a seq was skipped)."""
    frames: list[bytes] = []
    while sub.items:
        delivery = sub.items.popleft()
        for item in delivery.items if isinstance(delivery, Batch) else (delivery,):
            if isinstance(item, Live):
                if visible(item.type, item.data) and item not in finished:
                    item.frame = item.frame or _frame(None, item.type, item.text)
                    frames.append(item.frame)
                continue
            if item.seq <= position:
                continue  # already sent
            entry = item.entry
            if entry is None or (contiguous and item.seq != position + 1):
                return frames, position, False  # the rest of a batch is in the log too
            position = entry.seq
            finished.note(entry.type, entry.data)
            if (owner is None or entry.owner == owner) and visible(entry.type, entry.data):
                entry.frame = entry.frame or _frame(entry.seq, entry.type, entry.text)
                frames.append(entry.frame)
    return frames, position, True


def _response(
    rt: Runtime,
    hub: Hub,
    who: Principal,
    key: uuid.UUID,
    after: int,
    read: Reader,
    missed: Missed,
    visible: Visible,
    owner: str | None = None,
) -> EventSourceResponse:
    """Replay the log after `after`, then follow the hub until `who`'s key is revoked; `owner` keeps only that user's
    entries (lifecycle)."""
    factory = rt.sessions
    contiguous = key != events.LIFECYCLE  # a thread's seqs have no holes: a hole means "read the log"
    streams = rt.meter.streams.labels("thread" if contiguous else "lifecycle")

    async def backlog(position: int) -> Sequence[events.Row]:
        async with factory() as session:
            return await read(session, position, events.PAGE)

    async def oldest(position: int) -> int | None:
        async with factory() as session:
            return await missed(session, position)

    async def generate() -> AsyncIterator[ServerSentEvent | bytes]:
        position = after
        finished = _Finished()
        sub = hub.subscribe(key, who.key_id)  # subscribe first, then read the backlog: nothing falls between
        streams.inc()
        try:
            # shielded, as the backlog's reads are: a client hanging up mid-query must not cost the pool its connection
            kept = await asyncio.shield(oldest(position))
            if kept is not None:  # retention removed part of what was asked for, or it is past what is stored (a
                # database restored from an older backup): say so, then go on from the oldest event stored
                yield ServerSentEvent(event="events_missed", data=json.dumps(event_types.Missed(oldest_seq=kept)))
                position = kept - 1
            while True:
                rows = await asyncio.shield(backlog(position))  # shielded, as above
                if rows:
                    position = rows[-1].seq
                    for row in rows:
                        finished.note(row.type, row.data)
                    replay = [_frame(r.seq, r.type, json.dumps(r.data)) for r in rows if visible(r.type, r.data)]
                    if replay:
                        yield b"".join(replay)
                if len(rows) == events.PAGE:
                    if sub.overflowed:  # cut off (its key revoked) or lagging while the backlog replays
                        return
                    continue  # a full page: more may be stored; anything later is notified
                while True:  # follow the hub, sending what is buffered in one write, until only the log can help
                    await sub.wait()
                    frames, position, caught_up = _take(sub, position, contiguous, owner, visible, finished)
                    if frames:
                        yield b"".join(frames)
                    if not caught_up:
                        break
        except Overflow:
            return  # the client resumes with Last-Event-ID
        finally:
            streams.dec()
            hub.unsubscribe(sub)

    return _EventStream(generate(), rt.settings.sse_send_timeout)


@router.get(
    "/threads/{thread_id}/events",
    operation_id="streamEvents",
    response_class=EventSourceResponse,
    responses={**RESPONSES, 200: frames.response(frames.THREAD)},
)
async def stream(
    thread_id: uuid.UUID,
    rt: RuntimeDep,
    hub: HubDep,
    who: StreamReader,
    since: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    include_silent: bool = False,
    depth: Annotated[int, Query(ge=0, le=100)] = 0,
    reasoning: bool = False,
    last_event_id: Annotated[str | None, Header(max_length=100)] = None,
) -> EventSourceResponse:
    """Stored events of the thread after `Last-Event-ID` (or `since`), then live ones."""
    async with rt.sessions() as session:
        await threads.get(session, thread_id, who)

    async def read(session: AsyncSession, after: int, limit: int) -> Sequence[events.Row]:
        return await events.read(session, thread_id, after, limit)

    async def missed(session: AsyncSession, after: int) -> int | None:
        return await events.missed(session, thread_id, after)

    visible = _visible(include_silent, depth, reasoning)
    return _response(rt, hub, who, thread_id, _start(since, last_event_id), read, missed, visible)


@router.get(
    "/events",
    operation_id="streamAllEvents",
    response_class=EventSourceResponse,
    responses={**RESPONSES, 200: frames.response(frames.LIFECYCLE)},
)
async def lifecycle(
    rt: RuntimeDep,
    hub: HubDep,
    who: StreamReader,
    since: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    last_event_id: Annotated[str | None, Header(max_length=100)] = None,
) -> EventSourceResponse:
    """`thread_created`, `thread_updated`, `thread_deleted` for the caller's threads (every thread for an admin)."""
    user = None if who.admin else who.user_id

    async def read(session: AsyncSession, after: int, limit: int) -> Sequence[events.Row]:
        return await events.read_lifecycle(session, user, after, limit)

    return _response(
        rt,
        hub,
        who,
        events.LIFECYCLE,
        _start(since, last_event_id),
        read,
        events.missed_lifecycle,
        lambda *_: True,
        user,
    )


@router.post(
    "/stream-tokens", operation_id="createStreamToken", status_code=201, responses={404: {"model": schemas.Error}}
)
async def stream_token(
    body: schemas.StreamTokenIn, session: SessionDep, who: CurrentUser, rt: RuntimeDep
) -> schemas.StreamToken:
    """A short-lived token that opens one stream (a thread's, or `/events`) as the caller, given in the URL as
    `?token=` (browsers' `EventSource` cannot send `Authorization`); it stops working when its key is revoked."""
    if body.thread_id is not None:
        await threads.get(session, body.thread_id, who)
    scope = str(body.thread_id) if body.thread_id else tokens.EVENTS
    token = tokens.mint(rt.tokens, who, scope)
    path = f"/threads/{body.thread_id}/events" if body.thread_id else "/events"
    seconds = rt.settings.stream_token_seconds
    return schemas.StreamToken(token=token, expires_in=seconds, url=f"{path}?token={token}")
