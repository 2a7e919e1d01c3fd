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
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response
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


Visible = Callable[[str, dict[str, Any]], bool]


class _Visible:
    """Which events a thread's stream shows (its filters): an object, not a closure, as every open stream keeps one."""

    __slots__ = ("depth", "include_silent", "reasoning")

    def __init__(self, include_silent: bool, depth: int, reasoning: bool) -> None:
        self.include_silent, self.depth, self.reasoning = include_silent, depth, reasoning

    def __call__(self, type_: str, data: dict[str, Any]) -> bool:
        if int(data.get("depth", 0) or 0) > self.depth:
            return False
        if type_ == "reasoning_chunk" and not self.reasoning:
            return False
        return not (type_ == "message_data" and data.get("data", {}).get("silent") and not self.include_silent)


def _every(_type: str, _data: dict[str, Any]) -> bool:
    return True


def _start(since: int | None, last_event_id: str | None) -> int:
    """Where to resume: `Last-Event-ID` (a seq) wins over `since`; anything else starts at the beginning."""
    value = (last_event_id or "").strip()
    if value.isascii() and value.isdigit() and len(value) < 19:  # anything else (even "²") is not a seq
        return int(value)
    return since or 0


PING = b": ping\r\n\r\n"
HEADERS = (  # as Starlette would build them for this response; a list of them for each stream (CORS adds to it)
    (b"cache-control", b"no-store"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
)


class _EventStream(Response):
    """The SSE response, lean enough for 10,000 open streams in one process (bench/streams.py): the request's own
    task writes the frames, and one more waits for the client's disconnect (which ends the stream at once); its
    keepalives and its send timeout are the hub ticker's (`hub.Subscription`), not a task and a timer of its own.
    What a stream needs is kept on this object (no closures: each open stream holds its own).

    Replays the log of `key` after `after`, then follows the hub until `who`'s key is revoked; `owner` keeps only
    that user's entries (lifecycle).

    A send that waits `timeout` seconds for the client to read (any send: events, pings) drops the client: the
    connection is closed without ending the body, and the stream's subscription released. A stream ended by the hub
    (cut off, its key revoked, the process stopping) ends its body cleanly."""

    media_type = "text/event-stream"

    def __init__(
        self, rt: Runtime, hub: Hub, who: Principal, key: uuid.UUID, after: int, visible: Visible, owner: str | None
    ) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = list(HEADERS)
        self._hub, self._rt, self._who, self._key = hub, rt, who, key
        self._after, self._visible, self._owner = after, visible, owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub = self._hub
        hub.end_streams_on(self._rt.stopping)
        keepalive, timeout = KEEPALIVE_SECONDS, self._rt.settings.sse_send_timeout
        sub = hub.subscribe(self._key, self._who.key_id, keepalive=keepalive, send_timeout=timeout)
        sub.task = asyncio.current_task()
        gone = asyncio.ensure_future(_until_gone(receive, sub))
        streams = self._rt.meter.streams.labels("lifecycle" if self._key == events.LIFECYCLE else "thread")
        streams.inc()
        body = self._follow(sub)
        try:
            await self._send(sub, send, {"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in body:
                await self._send(sub, send, {"type": "http.response.body", "body": chunk, "more_body": True})
            await self._send(sub, send, {"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not sub.timed_out or task is None:
                raise
            task.uncancel()  # the ticker's cancel: the client stopped reading; the server closes the connection
            log.warning("dropped a stream: its client read nothing for %g s", timeout)
        finally:
            streams.dec()
            hub.unsubscribe(sub)
            gone.cancel()
            await body.aclose()

    @staticmethod
    async def _send(sub: Subscription, send: Send, message: Message) -> None:
        """Send, the time the send began on the subscription's clock for the ticker."""
        loop = asyncio.get_running_loop()
        sub.sending_since = loop.time()
        try:
            await send(message)
        finally:
            sub.sending_since = None
            sub.last_send = loop.time()

    async def _backlog(self, position: int) -> Sequence[events.Row]:
        async with self._rt.sessions() as session:
            if self._key == events.LIFECYCLE:
                return await events.read_lifecycle(session, self._owner, position, events.PAGE)
            return await events.read(session, self._key, position, events.PAGE)

    async def _oldest(self, position: int) -> int | None:
        async with self._rt.sessions() as session:
            if self._key == events.LIFECYCLE:
                return await events.missed_lifecycle(session, position)
            return await events.missed(session, self._key, position)

    async def _follow(self, sub: Subscription) -> AsyncGenerator[bytes, None]:
        position, visible = self._after, self._visible
        contiguous = self._key != events.LIFECYCLE  # a thread's seqs have no holes: a hole means "read the log"
        finished = _Finished()
        try:
            # shielded, as the backlog's reads are: a client hanging up mid-query must not cost the pool its connection
            kept = await asyncio.shield(self._oldest(position))
            if kept is not None:  # retention removed part of what was asked for, or it is past what is stored (a
                # database restored from an older backup): say so, then go on from the oldest event stored
                yield ServerSentEvent(
                    event="events_missed", data=json.dumps(event_types.Missed(oldest_seq=kept))
                ).encode()
                position = kept - 1
            while True:
                rows = await asyncio.shield(self._backlog(position))  # shielded, as above
                if rows:
                    position = rows[-1].seq
                    for row in rows:
                        finished.note(row.type, row.data)
                    replay = [_frame(r.seq, r.type, json.dumps(r.data)) for r in rows if visible(r.type, r.data)]
                    if replay:
                        yield b"".join(replay)
                if sub.overflowed:  # cut off (its key revoked, its client gone) or lagging while the backlog replays
                    return
                if len(rows) == events.PAGE:
                    continue  # a full page: more may be stored; anything later is notified
                while True:  # follow the hub, sending what is buffered in one write, until only the log can help
                    await sub.wait()
                    frames, position, caught_up = _take(sub, position, contiguous, self._owner, visible, finished)
                    if sub.ping:
                        sub.ping = False
                        if not frames:
                            frames.append(PING)
                    if frames:
                        yield b"".join(frames)
                    if not caught_up:
                        break
        except Overflow:
            return  # the client resumes with Last-Event-ID


async def _until_gone(receive: Receive, sub: Subscription) -> None:
    """End the stream once its client has gone."""
    while (await receive())["type"] != "http.disconnect":
        pass
    sub.cut_off()


class _Finished:
    """The messages whose last `message_data` a stream has passed was not `pending`: their deltas are stale.

    A delta of a message precedes the message's completion on the hub, so only the few messages that finished while
    the stream subscribed and read its backlog can have stale deltas still to come: the last `FINISHED` are kept."""

    __slots__ = ("_ids",)

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
    """An event's SSE frame; `text` is JSON (no line breaks but escaped ones), `type_` an event type."""
    head = f"event: {type_}\r\n" if seq is None else f"id: {seq}\r\nevent: {type_}\r\n"
    if "\n" in text or "\r" in text:  # not JSON as serialised here: each line its own `data:` line
        text = "\r\ndata: ".join(text.splitlines())
    return (head + "data: " + text + "\r\n\r\n").encode()


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
) -> Response:
    """Stored events of the thread after `Last-Event-ID` (or `since`), then live ones."""
    return await thread_events(rt, hub, who, thread_id, since, include_silent, depth, reasoning, last_event_id)


async def thread_events(
    rt: Runtime,
    hub: Hub,
    who: Principal,
    thread_id: uuid.UUID,
    since: int | None,
    include_silent: bool,
    depth: int,
    reasoning: bool,
    last_event_id: str | None,
) -> Response:
    """`stream`'s response once its parameters are read: also served in front of FastAPI (`app/api/streams.py`)."""
    async with rt.sessions() as session:
        await threads.get(session, thread_id, who)
    visible = _Visible(include_silent, depth, reasoning)
    return _EventStream(rt, hub, who, thread_id, _start(since, last_event_id), visible, None)


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
) -> Response:
    """`thread_created`, `thread_updated`, `thread_deleted` for the caller's threads (every thread for an admin)."""
    return lifecycle_events(rt, hub, who, since, last_event_id)


def lifecycle_events(rt: Runtime, hub: Hub, who: Principal, since: int | None, last_event_id: str | None) -> Response:
    """`lifecycle`'s response once its parameters are read: also served in front of FastAPI (`app/api/streams.py`)."""
    user = None if who.admin else who.user_id
    return _EventStream(rt, hub, who, events.LIFECYCLE, _start(since, last_event_id), _every, user)


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
