"""The two stream routes (`GET /threads/{id}/events`, `GET /events`) served in front of FastAPI's routing.

An open stream holds whatever its request passed through for as long as it is open: FastAPI's and Starlette's
per-request state (the request, the solved dependencies, the exit stacks, every middleware's suspended frame) was
about half of what one idle stream cost (bench/README.md, "Streams at chat-widget scale"). This middleware sits just
inside CORS and tracing and serves a stream request itself, with the routes' own code: the caller is read by the
same dependency (`deps.stream_reader`), the response is the route's (`events.thread_events`, `lifecycle_events`), and
a domain error is answered by the app's own handler (`errors.handler`), so status, headers and body are the ones
FastAPI would send.

It takes only what it can read exactly as FastAPI would: a GET without a body, the thread's id spelled as a UUID's
canonical 36 characters, each parameter in a plain spelling (`since=12`, `depth=2`, `reasoning=true`, a token or
`Last-Event-ID` within their lengths), no NUL. Anything else — a parameter FastAPI would refuse or read under a looser
spelling, a body, any other path or method — goes on to the app unchanged, which answers it as before (a 422, a 413,
the same stream). The routes stay registered in FastAPI too: they are documented in OpenAPI from there.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from fastapi.routing import APIRoute
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api import deps, errors
from app.api.routes import events as routes

THREAD = re.compile(r"/threads/([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})/events")
LIFECYCLE = "/events"
TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})  # the spellings pydantic reads as a bool, in lower case
FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
MAX_SINCE = 2**62
MAX_DEPTH = 100
MAX_TOKEN = 4096
MAX_LAST_EVENT_ID = 100
_ROUTES = {r.path: r for r in routes.router.routes if isinstance(r, APIRoute)}  # `scope["route"]`, as FastAPI sets it


@dataclass(frozen=True, slots=True)
class Asked:
    """A stream request's parameters, read as the route's signature reads them."""

    thread: str | None  # the path's spelling (a stream token names it so); None: the lifecycle stream
    token: str | None
    since: int | None
    last_event_id: str | None
    include_silent: bool = False
    depth: int = 0
    reasoning: bool = False


def _route_path(scope: Scope) -> str:
    """The path the app's routes match (`root_path` taken off, as Starlette's routing does)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] == "/":
        return path[len(root) :]
    return path


class _Loose(Exception):
    """A request this middleware leaves to FastAPI: FastAPI refuses it, or reads it under a spelling not read here."""


def _number(value: str | None, most: int) -> int | None:
    """A plain decimal within 0..`most`; None when absent."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) < 20 and int(value) <= most):
        raise _Loose()
    return int(value)


def _flag(value: str | None) -> bool:
    """A bool in one of pydantic's spellings (lower case); False when absent."""
    if value is None or value in FALSE:
        return False
    if value not in TRUE:
        raise _Loose()
    return True


def _last_event_id(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The `Last-Event-ID` header, if sent once and within its length, when no body comes with the request."""
    found: str | None = None
    for name, value in headers:
        if name in (b"content-length", b"transfer-encoding") and value != b"0":
            raise _Loose()  # a body: the guard counts it
        if name == b"last-event-id":
            if found is not None or len(value) > MAX_LAST_EVENT_ID:
                raise _Loose()
            found = value.decode("latin-1")
    return found


def asked(scope: Scope) -> Asked | None:
    """The parameters of a stream request this middleware serves itself; None: the app's routing takes it."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return None
    path = _route_path(scope)
    match = THREAD.fullmatch(path)
    query: bytes = scope.get("query_string", b"")
    if (match is None and path != LIFECYCLE) or b"%00" in query:  # a NUL: the guard refuses it
        return None
    try:
        last_event_id = _last_event_id(scope["headers"])
        params = QueryParams(query)  # as Starlette reads it: names percent-decoded, a repeated name's last counts
        token = params.get("token")
        if token is not None and len(token) > MAX_TOKEN:
            return None
        since = _number(params.get("since"), MAX_SINCE)
        if match is None:
            return Asked(None, token, since, last_event_id)
        include_silent, reasoning = _flag(params.get("include_silent")), _flag(params.get("reasoning"))
        depth = _number(params.get("depth"), MAX_DEPTH) or 0
        return Asked(match[1], token, since, last_event_id, include_silent, depth, reasoning)
    except _Loose:
        return None


class Streams:
    """Serves the stream requests `asked` reads; passes every other request on to `app`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = asked(scope)
        if wanted is None:
            await self.app(scope, receive, send)
            return
        response = await _open(scope, wanted)
        await response(scope, receive, send)


async def _open(scope: Scope, wanted: Asked) -> Response:
    """The stream's response, or the error the route would have answered with; the request and what reading the
    caller needed are released before the stream starts."""
    route = _ROUTES["/threads/{thread_id}/events" if wanted.thread else LIFECYCLE]
    scope["route"] = route
    scope["path_params"] = {"thread_id": wanted.thread} if wanted.thread else {}
    request = Request(scope)
    try:
        rt = await deps.runtime(request)
        who = await deps.stream_reader(request, rt, None, wanted.token)
        hub = await deps.hub(rt)
        if wanted.thread is None:
            return routes.lifecycle_events(rt, hub, who, wanted.since, wanted.last_event_id)
        thread_id = uuid.UUID(wanted.thread)
        return await routes.thread_events(
            rt,
            hub,
            who,
            thread_id,
            wanted.since,
            wanted.include_silent,
            wanted.depth,
            wanted.reasoning,
            wanted.last_event_id,
        )
    except Exception as exc:
        handle = errors.handler(exc)
        if handle is None:
            raise  # the app's catch-all (a 500, logged) is Starlette's outermost middleware
        return await handle(request, exc)
