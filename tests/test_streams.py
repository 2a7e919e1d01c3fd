"""The stream routes served in front of FastAPI (`app/api/streams.py`): what it takes and what it leaves to FastAPI,
and that what it answers — errors, resumed streams, the headers — is what FastAPI's own route answers, byte for byte."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app import keys
from app.api.streams import Asked, Streams, asked
from tests.test_stream import Serve, catalog, mark, serve

__all__ = ["serve"]  # the fixture, used by name

TID = "0b9e5a1c-3f1d-4c55-9a0e-3b1d2c4e5f60"


def scope(path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None, **extra: Any) -> Scope:
    return {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": headers or [], **extra}


def test_a_plain_stream_request_is_read_as_the_route_reads_it() -> None:
    query = b"since=12&depth=2&include_silent=yes&reasoning=1&token=t%3D&%74oken=abc"
    read = asked(scope(f"/threads/{TID}/events", query, [(b"last-event-id", b"7"), (b"content-length", b"0")]))
    assert read == Asked(TID, "abc", 12, "7", include_silent=True, depth=2, reasoning=True)
    upper = TID.upper()
    assert asked(scope(f"/threads/{upper}/events")) == Asked(upper, None, None, None)  # the path's spelling kept
    assert asked(scope("/events", b"since=0&depth=500")) == Asked(None, None, 0, None)  # not a parameter of it
    assert asked(scope(f"/api/threads/{TID}/events", root_path="/api")) == Asked(TID, None, None, None)


def test_anything_fastapi_must_read_or_refuse_goes_on_to_it() -> None:
    stream = f"/threads/{TID}/events"
    for left in (
        scope(stream, method="HEAD"),
        scope(stream, type="websocket"),
        scope(stream + "/"),
        scope(f"/threads/{TID[:-1]}/events"),
        scope(f"/threads/{TID.replace('-', '')}/events"),  # a UUID pydantic may read: FastAPI says
        scope(stream, b"since=-1"),
        scope(stream, b"since=+1"),
        scope(stream, b"since="),
        scope(stream, b"since=4611686018427387905"),  # past 2**62
        scope(stream, b"depth=101"),
        scope(stream, b"reasoning=True"),
        scope(stream, b"include_silent=maybe"),
        scope(stream, b"token=" + b"x" * 4097),
        scope(stream, b"token=a%00"),
        scope(stream, headers=[(b"last-event-id", b"1" * 101)]),
        scope(stream, headers=[(b"last-event-id", b"1"), (b"last-event-id", b"2")]),
        scope(stream, headers=[(b"content-length", b"3")]),  # a body: the guard counts it
        scope(stream, headers=[(b"transfer-encoding", b"chunked")]),
        scope("/events", b"since=x"),
        scope("/threads"),
    ):
        assert asked(left) is None, left


class _Reached:
    """Innermost middleware: the requests that reached FastAPI's routing."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['path']}?{scope['query_string'].decode()}")
        await self.app(scope, receive, send)


async def _apps(app_factory: Any) -> tuple[FastAPI, FastAPI, list[str]]:
    """The app, with a record of what reaches its routing, and the same app without `Streams` (FastAPI's routes)."""
    seen: list[str] = []
    fast = await app_factory(catalog([]))
    fast.user_middleware.append(Middleware(_Reached, seen=seen))  # built at the first request: innermost
    plain = await app_factory(catalog([]))
    plain.user_middleware = [m for m in plain.user_middleware if m.cls is not Streams]
    return fast, plain, seen


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost", timeout=20)


async def test_refusals_are_fastapis_own_byte_for_byte(app_factory: Any) -> None:
    fast, plain, seen = await _apps(app_factory)
    async with fast.state.runtime.sessions() as session, session.begin():
        _, ann = await keys.create(session, "ann")
        _, bob = await keys.create(session, "bob")
        revoked, old = await keys.create(session, "old")
        await keys.revoke(session, str(revoked.id))
    async with _client(fast) as f, _client(plain) as p:
        auth = {"Authorization": f"Bearer {ann}"}
        tid = (await f.post("/threads", json={"agent": "agent"}, headers=auth)).json()["id"]
        mine = f"/threads/{tid}/events"
        token = (await f.post("/stream-tokens", json={"thread_id": tid}, headers=auth)).json()["token"]
        seen.clear()
        cases: list[tuple[str, dict[str, str], int]] = [
            (mine, {}, 401),  # keys exist: no key, no stream
            (mine, {"Authorization": "Basic abc"}, 401),
            (mine, {"Authorization": "Bearer nope"}, 401),
            (mine, {"Authorization": f"Bearer {old}"}, 401),
            (f"/threads/{uuid.uuid4()}/events", {"Authorization": f"Bearer {ann}"}, 404),  # unknown thread
            (mine, {"Authorization": f"Bearer {bob}"}, 404),  # another user's thread
            (f"/threads/{uuid.uuid4()}/events?token={token}", {}, 401),  # a token for another thread
            (f"/events?token={token}", {}, 401),
            (f"{mine}?token=x{token}", {}, 401),
            ("/events", {"Authorization": "Bearer nope"}, 401),
        ]
        for path, headers, status in cases:
            ours, theirs = await f.get(path, headers=headers), await p.get(path, headers=headers)
            assert ours.status_code == theirs.status_code == status, (path, ours.text)
            assert ours.content == theirs.content and ours.headers == theirs.headers, path
            assert ours.json()["error"]["code"] in ("unauthorized", "thread_not_found")
        assert seen == []  # none of them reached FastAPI's routing
        loose = f"{mine}?since=-1"
        ours, theirs = await f.get(loose, headers=auth), await p.get(loose, headers=auth)
        assert ours.status_code == theirs.status_code == 422 and ours.content == theirs.content
        assert seen == [loose]  # left to FastAPI, which refused it as before
        paths = (await f.get("/openapi.json")).json()["paths"]  # still FastAPI's routes, documented as before
        assert paths["/threads/{thread_id}/events"]["get"]["operationId"] == "streamEvents"
        assert paths["/events"]["get"]["operationId"] == "streamAllEvents"


async def _head_and_body(base: str, path: str, headers: dict[str, str], until: bytes) -> tuple[list[Any], bytes]:
    """A stream's status and headers (without `date`), and its body up to and including `until`."""
    body = b""
    async with httpx.AsyncClient(base_url=base, timeout=20) as client, client.stream("GET", path, headers=headers) as r:
        async for chunk in r.aiter_raw():
            body += chunk
            if until in body:
                break
        head = [r.status_code, sorted((k, v) for k, v in r.headers.items() if k != "date")]
    return head, body[: body.index(until) + len(until)]


async def test_a_resumed_stream_is_the_routes_own_byte_for_byte(app_factory: Any, serve: Serve) -> None:
    fast, plain, seen = await _apps(app_factory)
    async with _client(fast) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    for i in range(4):
        await mark(fast, tid, i=i, text="line\nbreak é")
    ours, theirs = await asyncio.gather(serve(fast), serve(plain))
    end = b'"i": 3'
    seen.clear()
    for path, headers in (
        (f"/threads/{tid}/events", {"Last-Event-ID": "2"}),
        (f"/threads/{tid}/events?since=1&depth=0&include_silent=false", {}),
        ("/events", {}),
    ):
        until = end if path != "/events" else b"thread_created"
        fast_head, fast_body = await _head_and_body(ours, path, headers, until)
        plain_head, plain_body = await _head_and_body(theirs, path, headers, until)
        assert fast_head == plain_head and fast_body == plain_body, path
        assert fast_head[0] == 200 and (b"id: 3\r\n" in fast_body) == (path != "/events")
    assert seen == []  # all served in front of FastAPI
    resumed = (await _head_and_body(ours, f"/threads/{tid}/events", {"Last-Event-ID": "2"}, end))[1]
    assert resumed.startswith(b"id: 3\r\nevent: event\r\n") and b"id: 2\r\n" not in resumed
