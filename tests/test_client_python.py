"""The Python client (`clients/python`, imported from its source: pyproject's `pythonpath`) against a live server:
the app with a worker served by uvicorn on a free port of this machine, the example agents on the offline `test`
model, real HTTP. A TCP proxy in front of it cuts a stream mid-frame to show that the client resumes without a gap or
a duplicate. The sync client runs in a thread of its own (the server runs on the test's event loop)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, get_type_hints

import agents_client
import httpx
import pytest
from agents_client import errors, models, sse
from agents_client import events as client_events
from fastapi import FastAPI

from app import catalog, event_types, keys
from app.catalog import Catalog
from app.spec import define_agent, define_model, define_prompt
from tests import processes
from tests.conftest import ROOT
from tests.test_subagents import Brain, delegate
from tests.test_subagents import catalog as subagents_catalog

CLIENT = ROOT / "clients" / "python"
Serve = Callable[[FastAPI], Awaitable[str]]


@pytest.fixture
async def live(app_factory: Any, serve: Serve) -> str:
    """The base URL of a server of the example agents, with a worker."""
    return await serve(await app_factory(catalog.load(ROOT / "agents"), with_worker=True))


@pytest.fixture
async def client(live: str) -> AsyncIterator[agents_client.AsyncClient]:
    async with agents_client.AsyncClient(live) as made:
        yield made


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# -- what the client is made of ---------------------------------------------------------------------------------


def test_the_client_has_the_servers_version() -> None:
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())
    assert agents_client.__version__ == server
    assert project["project"]["name"] == "standard-agents-client"
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "agents_client.version.VERSION"}
    assert sorted(re.split(r"[<>=]", d)[0] for d in project["project"]["dependencies"]) == ["httpx", "pydantic"]


def test_every_request_says_who_sends_it_and_with_which_key() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "ok", "version": "0.1.0"})

    with agents_client.Client("http://api.test", "sa_key", transport=httpx.MockTransport(answer)) as sync:
        assert sync.health().status == "ok"
    assert seen[0].headers["user-agent"] == f"standard-agents-client-python/{agents_client.__version__}"
    assert seen[0].headers["authorization"] == "Bearer sa_key"
    assert str(seen[0].url) == "http://api.test/health"


@pytest.mark.parametrize(
    ("client_table", "server_table"),
    [
        (client_events.THREAD_EVENTS, event_types.THREAD_EVENTS),
        (client_events.LIFECYCLE_EVENTS, event_types.LIFECYCLE_EVENTS),
    ],
)
def test_the_event_models_are_the_servers_table_of_event_types(
    client_table: dict[str, type[client_events.Payload]], server_table: dict[str, type]
) -> None:
    assert client_table.keys() == server_table.keys()
    for name, payload in server_table.items():
        fields = {f.alias or n for n, f in client_table[name].model_fields.items()}
        assert fields == set(get_type_hints(payload)), name


def test_an_error_answer_that_is_no_envelope_is_still_an_api_error() -> None:
    page = httpx.MockTransport(lambda request: httpx.Response(502, text="<html>Bad gateway</html>"))
    with agents_client.Client("http://api.test", transport=page) as sync, pytest.raises(errors.ServerError) as caught:
        sync.threads.get(uuid.uuid4())
    assert (caught.value.status, caught.value.code) == (502, "http_502")
    assert "Bad gateway" in caught.value.message


def test_the_sse_decoder_reads_frames_as_the_standard_says() -> None:
    decoder = sse.Decoder()
    lines = [": ping - now", "id: 7", "event: error", 'data: {"code": "x",', 'data:"message": "y"}', "retry: 5", ""]
    assert [decoder.feed(line) for line in lines][-1] == sse.Frame("error", "7", '{"code": "x",\n"message": "y"}')
    assert decoder.feed("") is None  # a blank line alone is no frame
    assert [decoder.feed(line) for line in ("data: {}", "")][-1] == sse.Frame("message", None, "{}")  # ids don't carry


# -- streams resume: the rules, on a scripted transport -----------------------------------------------------------


def frames(*events: tuple[int | None, str, dict[str, Any]]) -> bytes:
    out = []
    for seq, name, data in events:
        head = "" if seq is None else f"id: {seq}\r\n"
        out.append(f"{head}event: {name}\r\ndata: {json.dumps(data)}\r\n\r\n")
    return "".join(out).encode()


STEP = {"step": 1, "side": "a"}


class Dropped(httpx.SyncByteStream):
    """An answer's body that is cut off after `body` (no `drop`: it ends cleanly)."""

    def __init__(self, body: bytes, drop: bool = True) -> None:
        self.body = body
        self.drop = drop

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        if self.drop:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def scripted(answers: list[httpx.Response]) -> tuple[agents_client.Client, list[httpx.Request]]:
    requests: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return answers.pop(0)

    made = agents_client.Client(
        "http://api.test", transport=httpx.MockTransport(answer), stream_retries=2, stream_backoff=0
    )
    return made, requests


def streamed(body: bytes, drop: bool = True) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Dropped(body, drop))


def test_a_stream_resumes_after_the_last_seq_and_drops_what_is_replayed() -> None:
    first = frames((1, "step_started", STEP), (None, "message_chunk", {"message_id": "m", "depth": 0, "offset": 0,
                   "chunk": "Hi", "attempt": 1}), (2, "step_started", STEP))  # fmt: skip
    partial = b"id: 3\r\nevent: step_sta"  # cut mid-frame: never yielded
    replayed = frames((2, "step_started", STEP), (3, "turn_ended", {"side": "a", "reason": "stop_on_response"}))
    sync, requests = scripted([streamed(first + partial), streamed(replayed, drop=False)])
    with sync, sync.events.stream("t", since=0) as stream:
        got = [(e.seq, e.name) for e in (next(stream), next(stream), next(stream), next(stream))]
        assert stream.last_seq == 3
    assert got == [(1, "step_started"), (None, "message_chunk"), (2, "step_started"), (3, "turn_ended")]
    assert [r.headers.get("last-event-id") for r in requests] == ["0", "2"]
    assert requests[0].url.path == "/threads/t/events"


def test_a_stream_gives_up_after_its_retries_and_raises_an_error_answer_at_once() -> None:
    sync, requests = scripted([streamed(b""), streamed(b"", drop=False), streamed(b"")])
    with sync, pytest.raises(errors.TransportError):
        next(sync.events.stream("t"))
    assert len(requests) == 3  # the first connection and two retries, none yielding anything

    gone = {"error": {"code": "thread_not_found", "message": "Thread not found."}}
    sync, requests = scripted([httpx.Response(503, json={"error": {"code": "busy", "message": "m"}}),
                               httpx.Response(404, json=gone)])  # fmt: skip
    with sync, pytest.raises(errors.NotFound) as caught:
        next(sync.events.stream("t"))
    assert caught.value.code == "thread_not_found" and len(requests) == 2


# -- the API, live ------------------------------------------------------------------------------------------------


async def test_a_chat_loop_with_a_tool_turn(client: agents_client.AsyncClient) -> None:
    health = await client.health()
    assert (health.status, health.version) == ("ok", agents_client.__version__)  # the server's version is the client's
    assert "assistant" in [a.name for a in await client.agents.list()]
    assistant = await client.agents.get("assistant")
    assert assistant.side_a.prompt == "assistant"
    assert {t.name: t.kind for t in assistant.prompt_details[0].tools} == {
        "calculate": "tool",
        "get_time": "tool",
        "write_report": "tool",
        "set_reminder": "tool",
    }
    thread = await client.threads.create("assistant", name="sums", tags=["client"])
    turn = await client.messages.post(thread, "What is 12 * (3 + 4)?", wait=30)
    assert (turn.done, turn.status, turn.outcome, turn.error) == (True, "idle", "completed", None)
    assert [m.role for m in turn.messages] == ["user", "assistant", "tool", "assistant"]
    call = turn.messages[1].tool_calls
    assert call is not None and call[0].function.name == "calculate"
    assert json.loads(call[0].function.arguments) == {"expression": "12 * (3 + 4)"}
    assert turn.messages[2].content == "84" and turn.reply == "The answer is 84."

    queued = await client.messages.post(thread.id, "What is 1 + 1?")
    assert isinstance(queued, models.Queued) and queued.status == "queued"
    listed = (await client.messages.list(thread)).messages
    assert [m.id for m in listed[:4]] == [m.id for m in turn.messages] and listed[4].id == queued.message_id
    first = turn.messages[0]
    edited = await client.messages.edit(thread, first.id, "What is 12 * 7?")
    assert edited.content == "What is 12 * 7?" == (await client.messages.get(thread, first.id)).content

    assert (await client.threads.update(thread, name="renamed")).name == "renamed"
    page = await client.threads.list(agent="assistant", tag="client")
    assert [t.id for t in page.threads] == [thread.id] and page.next_cursor is None
    tool_log = (await client.threads.logs(thread, kind="tool")).logs[0]
    assert tool_log.tool == "calculate"
    one = await client.threads.log(thread, tool_log.id)
    assert isinstance(one, models.LogDetail) and one.id == tool_log.id and one.request_full is None
    assert (await client.threads.subagents(thread)).subagents == []
    assert (await client.threads.delete(thread)).deleted == [thread.id]
    with pytest.raises(errors.NotFound) as caught:
        await client.threads.get(thread)
    assert (caught.value.status, caught.value.code) == (404, "thread_not_found")


async def test_a_failed_turn_says_why_and_its_stream_comes_to_rest(app_factory: Any, serve: Serve) -> None:
    model = define_model(name="m", provider="test", script=[{"error": "the provider is down"}] * 2)
    prompt = define_prompt(name="p", tool_description="t", model="m", prompt="Answer.", include_chat=True)
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    failing = Catalog(root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={})
    async with agents_client.AsyncClient(await serve(await app_factory(failing, with_worker=True))) as client:
        thread = await client.threads.create("agent")
        turn = await client.messages.post(thread, "hello", wait=30)
        assert (turn.done, turn.status, turn.outcome, turn.reply) == (True, "idle", "failed", None)
        assert turn.error == models.TurnError(code="llm_error", message="the provider is down")
        assert turn.messages[-1].metadata["error"] == {"code": "llm_error", "message": "the provider is down"}
        async with client.events.stream(thread) as stream:
            seen = [e async for e in _until(stream, lambda e: e.at_rest)]
    assert client_events.Error(code="llm_error", message="the provider is down") in [e.data for e in seen]
    assert "turn_ended" not in [e.name for e in seen]  # a failed turn has none: `at_rest` ends it


async def test_stop_continue_terminate_and_the_errors_they_lead_to(client: agents_client.AsyncClient) -> None:
    thread = await client.threads.create("assistant")
    assert (await client.threads.stop(thread)).status == "stopped"
    assert (await client.threads.continue_(thread)).status in ("queued", "running", "idle")
    with pytest.raises(errors.Conflict) as refused:
        await client.threads.continue_(thread, side="b")
    assert refused.value.code == "no_such_side" and refused.value.status == 409
    assert (await client.threads.terminate(thread)).status == "terminated"
    with pytest.raises(errors.Conflict) as terminated:
        await client.messages.post(thread, "hello")
    assert terminated.value.code == "thread_terminated"
    with pytest.raises(errors.Invalid) as invalid:
        await client.messages.post(thread, "hello", wait=301)
    assert invalid.value.code == "invalid_request" and invalid.value.details["problems"][0]["field"] == "query.wait"


async def test_the_key_goes_with_every_call_and_every_stream(app_factory: Any, serve: Serve) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    async with app.state.runtime.sessions() as session, session.begin():
        _, key = await keys.create(session, "alice")
    url = await serve(app)
    async with agents_client.AsyncClient(url, key) as alice, agents_client.AsyncClient(url) as nobody:
        assert (await nobody.health()).status == "ok"
        with pytest.raises(errors.Unauthorized) as refused:
            await nobody.threads.list()
        assert refused.value.code == "unauthorized" and refused.value.headers["www-authenticate"] == "Bearer"
        thread = await alice.threads.create("assistant")
        assert thread.user_id == "alice"
        assert (await alice.messages.post(thread, "What is 6 * 7?", wait=30)).reply == "The answer is 42."
        async with alice.events.stream(thread) as stream:
            assert (await anext(stream)).seq == 1
        async with nobody.events.stream(thread) as stream:
            with pytest.raises(errors.Unauthorized):  # at once: no retry makes a missing key right
                await anext(stream)
            assert stream.position.connections == 1


async def test_a_closed_port_is_a_transport_error() -> None:
    async with agents_client.AsyncClient(f"http://127.0.0.1:{processes.free_port()}") as nowhere:
        with pytest.raises(errors.TransportError) as caught:
            await nowhere.health()
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_effects_endpoints_stream_tokens_and_the_lifecycle_stream(client: agents_client.AsyncClient) -> None:
    thread = await client.threads.create("assistant")
    turn = await client.messages.post(thread, "remind me in 3600 seconds to stretch", wait=30)
    assert turn.reply == "Done: I will remind you."
    [effect] = (await client.effects.list(thread)).effects
    assert (effect.name, effect.status, effect.args) == ("remind", "scheduled", {"text": "stretch"})
    assert (await client.effects.cancel(thread, effect.id)).status == "cancelled"

    summary = await client.endpoints.call(thread, "summary")
    assert summary["agent"] == "assistant" and summary["last_message"] == "Done: I will remind you."
    with pytest.raises(errors.NotFound) as missing:
        await client.endpoints.call(thread, "nowhere")
    assert missing.value.code == "endpoint_not_found"

    token = await client.events.token(thread)
    assert token.url == f"/threads/{thread.id}/events?token={token.token}" and token.expires_in > 0
    assert (await client.events.token()).url.startswith("/events?token=")

    async with client.events.stream_all() as lifecycle:
        created = [e async for e in _until(lifecycle, lambda e: e.name == "thread_created")]
    assert isinstance(created[-1].data, client_events.Lifecycle) and created[-1].data.thread_id == str(thread.id)


async def _until(
    stream: agents_client.AsyncEventStream, last: Callable[[agents_client.Event], bool]
) -> AsyncIterator[agents_client.Event]:
    async for event in stream:
        yield event
        if last(event):
            return


async def test_files_and_attachments(client: agents_client.AsyncClient) -> None:
    thread = await client.threads.create("assistant")
    record = await client.files.upload(thread, "/notes/to do #1.md", b"# Today\n\n- TODO water the plants\n",
                                       "text/markdown")  # fmt: skip
    assert (record.path, record.mime_type, record.size) == ("/notes/to do #1.md", "text/markdown", 33)
    assert await client.files.download(thread, record.path) == b"# Today\n\n- TODO water the plants\n"
    assert [e.name for e in (await client.files.list(thread, "/notes")).entries] == ["to do #1.md"]
    assert [e.path for e in (await client.files.find(thread, "*.md")).entries] == [record.path]
    [match] = (await client.files.grep(thread, "TODO")).matches
    assert (match.path, match.line, match.text) == (record.path, 3, "- TODO water the plants")
    assert (await client.files.usage(thread)).files == 1

    posted = await client.messages.post(
        thread, "Here is my cat.", attachments=[("cat.txt", b"meow", "text/plain")], wait=30
    )
    assert (
        posted.done
        and posted.messages[0].attachments == (await client.messages.get(thread, posted.message_id)).attachments
    )
    [attachment] = posted.messages[0].attachments
    assert attachment["name"] == "cat.txt" and attachment["path"].startswith("/attachments/")
    assert await client.files.download(thread, attachment["path"]) == b"meow"

    assert await client.files.delete(thread, record.path) == record.path
    with pytest.raises(errors.NotFound) as gone:
        await client.files.download(thread, record.path)
    assert gone.value.code == "file_not_found"


async def test_the_variables_bootstrap(app_factory: Any, serve: Serve) -> None:
    token = {"name": "API_TOKEN", "type": "secret", "required": True, "scoped": True}
    url = await serve(await app_factory(subagents_catalog(Brain(delegate()), {"name": "qa"}, variables=[token]),
                                        with_worker=True))  # fmt: skip
    async with agents_client.AsyncClient(url) as boss:
        thread = await boss.threads.create("boss")
        turn = await boss.messages.post(thread, "go", wait=30)
        assert turn.outcome == "completed"
        [tool] = [m for m in turn.messages if m.role == "tool"]
        request_id = tool.metadata["error_data"]["request_id"]
        waiting = await boss.variables.get(thread, request_id)
        assert (waiting.agent, waiting.missing, waiting.status) == ("qa", ["API_TOKEN"], "pending")
        with pytest.raises(errors.BadRequest) as missing:
            await boss.variables.provide(thread, request_id, {"OTHER": "x"})
        assert missing.value.code == "missing_variables" and missing.value.details["missing"] == ["API_TOKEN"]
        done = await boss.variables.provide(thread, request_id, {"API_TOKEN": "tok-123"})
        assert done.status == "success" and (await boss.variables.get(thread, request_id)).status == "success"
        child = await boss.threads.get(done.child_thread_id)
        assert child.parent_id == thread.id and child.env_types["API_TOKEN"] == "secret"
        with pytest.raises(errors.Conflict) as again:
            await boss.variables.provide(thread, request_id, {"API_TOKEN": "tok-123"})
        assert again.value.code == "already_used"


async def test_the_sync_client_has_the_same_surface() -> None:
    async with agents_client.AsyncClient() as made:
        with agents_client.Client() as sync:
            assert {m for m in dir(sync) if not m.startswith("_")} - {"close"} == {
                m for m in dir(made) if not m.startswith("_")
            } - {"aclose"}
            for name in (
                "threads",
                "messages",
                "events",
                "files",
                "effects",
                "variables",
                "endpoints",
                "agents",
                "env",
            ):
                ours = {m for m in dir(getattr(sync, name)) if not m.startswith("_")}
                assert ours == {m for m in dir(getattr(made, name)) if not m.startswith("_")}, name


async def test_the_sync_client_live(live: str) -> None:
    def chat() -> tuple[models.Turn, list[agents_client.Event], models.EnvVariable]:
        with agents_client.Client(live) as sync:
            thread = sync.threads.create("assistant")
            turn = sync.messages.post(thread, "What is 2 + 3?", wait=30)
            with sync.events.stream(thread) as stream:
                seen = []
                for event in stream:
                    seen.append(event)
                    if event.at_rest:
                        break
            with pytest.raises(errors.NotFound):
                sync.messages.get(thread, uuid.uuid4())
            return turn, seen, sync.env.set("COLOUR", "blue")

    turn, seen, variable = await asyncio.to_thread(chat)
    assert turn.reply == "The answer is 5."
    assert [e.seq for e in seen if e.seq is not None] == list(range(1, len([e for e in seen if e.seq]) + 1))
    assert client_events.TurnEnded(side="a", reason="stop_on_response") in [e.data for e in seen]
    assert seen[-1].data == client_events.ThreadStatus(status="idle") and not any(e.at_rest for e in seen[:-1])
    data = [e.data for e in seen if isinstance(e.data, client_events.MessageData)]
    assert data[-1].data.content == "The answer is 5."
    assert (variable.name, variable.value) == ("COLOUR", "blue")


# -- a dropped stream, live ---------------------------------------------------------------------------------------


class Proxy:
    """A TCP proxy in front of a server. It cuts its first connection in the middle of the answer's frame number
    `cut + 1` (its id line relayed, its event line half), and, with `forget`, removes `Last-Event-ID` from later
    requests (the server then replays from the start). It keeps every request's head."""

    def __init__(self, upstream: int, cut: int, forget: bool = False) -> None:
        self.upstream = upstream
        self.cut = cut
        self.forget = forget
        self.heads: list[str] = []
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.WriteTransport] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for transport in self._open:
            transport.abort()
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = not self.heads
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        self.heads.append(head)
        if self.forget and not first:
            head = re.sub(r"(?im)^last-event-id:.*\r\n", "", head)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        ends = (writer.transport, up_writer.transport)
        self._open.update(ends)
        up_writer.write(head.encode())
        relayed = b""
        try:
            while data := await up_reader.read(65536):
                if first:
                    relayed += data
                    starts = [m.start() for m in re.finditer(rb"event: ", relayed)]
                    if len(starts) > self.cut:  # the next frame's event line has begun: send half of it, and cut
                        writer.write(data[: len(data) - (len(relayed) - starts[self.cut]) + 3])
                        break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            for transport in ends:
                transport.abort()  # a reset: no clean end of the answer
                self._open.discard(transport)


@pytest.fixture
async def proxies() -> AsyncIterator[list[Proxy]]:
    made: list[Proxy] = []
    yield made
    for proxy in made:
        await proxy.close()


def stored(seen: list[agents_client.Event]) -> list[tuple[int, str]]:
    return [(e.seq, e.name) for e in seen if e.seq is not None]


async def test_a_dropped_stream_resumes_without_a_gap_or_a_duplicate(
    client: agents_client.AsyncClient, live: str, proxies: list[Proxy]
) -> None:
    thread = await client.threads.create("assistant")
    assert (await client.messages.post(thread, "What is 2 + 3?", wait=30)).done
    proxy = Proxy(port_of(live), cut=3)
    proxies.append(proxy)
    seen: list[agents_client.Event] = []
    via = agents_client.AsyncClient(await proxy.start(), stream_backoff=0.01)
    async with via, via.events.stream(thread) as stream:
        async for event in stream:
            seen.append(event)
            if len(seen) == 3:  # the connection is being cut: the next turn's events come after it
                await client.messages.post(thread, "What is 4 * 5?")
            if event.name == "turn_ended" and len([e for e in seen if e.name == "turn_ended"]) == 2:
                break
    assert stream.position.connections == len(proxy.heads) == 2
    assert "last-event-id: 3\r\n" in proxy.heads[1].lower()
    last = stored(seen)[-1][0]
    async with client.events.stream(thread) as again:
        everything = [e async for e in _until(again, lambda e: e.seq == last)]
    assert stored(seen) == stored(everything) and [s for s, _ in stored(seen)] == list(range(1, last + 1))
    assert [e.data.data.content for e in seen if isinstance(e.data, client_events.MessageData)][
        -1
    ] == "The answer is 20."


async def test_a_stream_yields_nothing_twice_when_the_server_replays_everything(
    client: agents_client.AsyncClient, live: str, proxies: list[Proxy]
) -> None:
    """The sync client, behind a proxy that drops its `Last-Event-ID`: the server replays from the start, and the
    client skips what it already yielded."""
    thread = await client.threads.create("assistant")
    assert (await client.messages.post(thread, "What is 2 + 3?", wait=30)).done
    proxy = Proxy(port_of(live), cut=4, forget=True)
    proxies.append(proxy)
    base = await proxy.start()

    def read() -> list[agents_client.Event]:
        with agents_client.Client(base, stream_backoff=0.01) as sync, sync.events.stream(thread) as stream:
            return [e for _, e in zip(range(8), stream, strict=False)]

    seen = await asyncio.to_thread(read)
    assert len(proxy.heads) == 2 and "last-event-id: 4\r\n" in proxy.heads[1].lower()  # sent; the proxy drops it
    assert [s for s, _ in stored(seen)] == list(range(1, 9))


# -- a newcomer's install -----------------------------------------------------------------------------------------


def readme_loop(index: int = 0) -> str:
    """A `python` block of the client's README: 0 the chat loop that waits, 1 the one that follows the stream."""
    blocks: list[str] = re.findall(r"```python\n(.*?)```", (CLIENT / "README.md").read_text(), re.S)
    return blocks[index]


def test_the_readme_loop_is_ten_lines() -> None:
    assert len(readme_loop(0).strip().splitlines()) <= 10
    assert "wait=" in readme_loop(0) and "events.stream(" in readme_loop(1)


LEFT_BY_BUILDS = ("build", "*.egg-info", "__pycache__")


def install(folder: Path) -> tuple[Path, str]:
    """A fresh venv in `folder` with the client installed as a newcomer would (`pip install ./clients/python`), its
    dependencies, pip and build backend taken from the test's own environment (a `.pth` file naming its
    site-packages; `--system-site-packages` would give the base Python's instead, and the venv's own pip would bring
    an older setuptools): nothing downloads. Its python, its site-packages."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([python, "-c", where], check=True, capture_output=True, text=True).stdout.strip()
    ours = sorted({p for p in sys.path if p.endswith("site-packages")})
    (Path(site) / "test-dependencies.pth").write_text("\n".join(ours) + "\n")
    # from a copy: the build leaves `build/` and `*.egg-info` beside the sources
    shutil.copytree(CLIENT, folder / "clients" / "python", ignore=shutil.ignore_patterns(*LEFT_BY_BUILDS))
    flags = ["--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([python, "-m", "pip", "install", *flags, "./clients/python"], check=True, cwd=folder)
    return python, site


@pytest.mark.slow  # a venv, a pip install and `agents serve`: some seconds
async def test_a_newcomer_installs_the_client_and_runs_the_readme_loop(database_url: str, tmp_path: Path) -> None:
    """The README's loop, as written, run by the installed client against `agents serve`, from a folder outside the
    repository."""
    python, site = await asyncio.to_thread(install, tmp_path)
    port = processes.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR", "AGENTS_PROVIDER")}
    env |= {"DATABASE_URL": database_url, "PORT": str(port), "DATA_DIR": str(tmp_path / "data")}
    log = tmp_path / "serve.log"
    server = processes.start(["serve"], env, log)
    try:
        await processes.until_ready(f"http://127.0.0.1:{port}", server, log)
        plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        pipe = asyncio.subprocess.PIPE
        where = "import agents_client; print(agents_client.__file__)"
        run = await asyncio.create_subprocess_exec(python, "-c", where, cwd=tmp_path, env=plain, stdout=pipe)
        installed = (await run.communicate())[0].decode()
        outputs = []
        for index in (0, 1):
            script = tmp_path / f"chat{index}.py"
            script.write_text(readme_loop(index).replace("localhost:8000", f"localhost:{port}"))
            chat = await asyncio.create_subprocess_exec(python, str(script), cwd=tmp_path, env=plain, stdin=pipe,
                                                        stdout=pipe, stderr=asyncio.subprocess.STDOUT)  # fmt: skip
            said = await asyncio.wait_for(chat.communicate(b"What is 12 * (3 + 4)?\nAnd 2 + 2?\n"), 120)
            outputs.append((chat.returncode, said[0].decode()))
    finally:
        assert processes.stop(server) == 0, log.read_text()[-4000:]
    assert installed.startswith(site), installed
    for code, out in outputs:
        assert code == 0, out
        assert out.splitlines() == ["The answer is 84.", "The answer is 4."]
