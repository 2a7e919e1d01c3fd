"""`GET /threads/{id}/events` is durable and resumable (`storage-and-queue.md` "The event log", `http-api.md`
"Stream"): every resume point replays exactly the stored suffix, clients that drop at random rebuild the exact
transcript, events cross from an `agents worker` process to `agents api` processes, a slow subscriber is cut off and
resumes without loss, a client that stops reading is dropped, the filters hold, and a revoked key ends its streams.
Streams run over real HTTP servers (ASGITransport buffers responses)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import func, select

from app import db, events, keys, messages, tokens
from app.api import schemas
from app.catalog import Catalog
from app.spec import define_agent, define_model, define_prompt
from tests.conftest import ROOT, Server, wait_for
from tests.processes import free_port, start, stop, until_ready
from tests.test_api import turn
from tests.tools import add

Frame = dict[str, Any]
Serve = Callable[..., Awaitable[str]]


def call(a: int, b: int) -> dict[str, Any]:
    return {"name": "add", "arguments": {"a": a, "b": b}}


def catalog(script: list[Any], *, chunk_size: int = 3, delay_ms: int = 0) -> Catalog:
    model = define_model(name="m", provider="test", script=script, chunk_size=chunk_size, delay_ms=delay_ms)
    prompt = define_prompt(
        name="p",
        tool_description="t",
        model="m",
        prompt="Add.",
        include_chat=True,
        include_past_tools=True,
        tools=["add"],
    )
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={"add": add}
    )


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serve apps on real uvicorn servers; stopped at teardown."""
    servers: list[tuple[Server, asyncio.Task[None]]] = []

    async def run(app: FastAPI, sndbuf: int | None = None) -> str:
        sock = socket.socket()
        if sndbuf is not None:  # connections inherit the listening socket's send buffer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.bind(("127.0.0.1", 0))
        server = Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
        servers.append((server, await server.start([sock])))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield run
    await asyncio.gather(*(server.stop(task) for server, task in servers))


async def follow(
    client: httpx.AsyncClient,
    path: str,
    out: list[Frame],
    stop: Callable[[Frame], bool],
    headers: dict[str, Any] | None = None,
) -> bool:
    """Append one connection's SSE frames to `out` until `stop(frame)` (then hang up: True) or the server ends the
    stream (False). Frames land in `out` as they complete, so a connection cut by a timeout keeps what it read."""
    frame: Frame = {}
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        async for line in response.aiter_lines():
            if line.startswith(":"):
                continue  # keep-alive comment
            if line:
                key, _, value = line.partition(":")
                frame[key] = json.loads(value) if key == "data" else value.strip()
                continue
            if "event" in frame:
                out.append(frame)
                if stop(frame):
                    return True
            frame = {}
    return False


def marked(frame: Frame) -> bool:
    """Whether the frame is a marker `mark` committed."""
    return bool(frame["event"] == "event" and frame["data"]["event_type"] == "marker")


def until_id(seq: int) -> Callable[[Frame], bool]:
    return lambda f: f.get("id") == str(seq)


def until_turns(frames: list[Frame], n: int) -> Callable[[Frame], bool]:
    """Stop once `frames` (the list the reader fills) holds `n` ended turns."""
    return lambda f: turns_in(frames) == n


def stored_frames(frames: list[Frame]) -> list[tuple[int, str, Any]]:
    return [(int(f["id"]), f["event"], f["data"]) for f in frames if "id" in f]


async def log_of(app: FastAPI, tid: str) -> list[tuple[int, str, Any]]:
    """The thread's stored event log."""
    async with app.state.runtime.sessions() as session:
        rows = await events.read(session, uuid.UUID(tid), 0, limit=100_000)
    return [(r.seq, r.type, r.data) for r in rows]


async def mark(app: FastAPI, tid: str, **data: Any) -> int:
    """Commit one more stored event (a client-visible `event`), so a reader knows where the log ends; its seq."""
    async with app.state.runtime.sessions() as session, session.begin():
        seq = await events.append(session, uuid.UUID(tid), "event", {"event_type": "marker", "data": data})
    assert seq is not None  # not held: stored at once
    return seq


def normal(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the API's schema renders it (`message_data` and `GET /messages` spell datetimes differently)."""
    dumped: dict[str, Any] = schemas.Message.model_validate(message).model_dump(mode="json")
    return dumped


# -- 1. every resume point -------------------------------------------------------------------------------------

TWO_TURNS = [
    {"text": "Adding both.", "tool_calls": [call(2, 3), call(4, 5)]},
    "Those are 5 and 9.",
    {"tool_calls": [call(1, 1)]},
    "That is 2.",
]


async def test_every_resume_point_replays_exactly_the_stored_suffix(app_factory: Any, serve: Serve) -> None:
    app = await app_factory(catalog(TWO_TURNS), with_worker=True)
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        for text in ("2+3 and 4+5?", "and 1+1?"):
            await turn(client, tid, text)
        history = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        roles = [m["role"] for m in history]
        assert roles == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool", "assistant"]
        log = await log_of(app, tid)
        last = len(log)
        assert [seq for seq, _, _ in log] == list(range(1, last + 1))
        assert {"message_data", "tool_started", "tool_completed", "turn_ended"} <= {t for _, t, _ in log}
        end = await mark(app, tid)
        log = await log_of(app, tid)
        path = f"/threads/{tid}/events"

        async def resume(after: int) -> None:
            by_header: list[Frame] = []
            by_since: list[Frame] = []
            await follow(client, path, by_header, until_id(end), headers={"Last-Event-ID": str(after)})
            await follow(client, f"{path}?since={after}", by_since, until_id(end))
            assert all("id" in f for f in by_header + by_since)  # nothing live is replayed
            assert stored_frames(by_header) == stored_frames(by_since) == log[after:], f"resuming after {after}"

        await asyncio.gather(*(resume(after) for after in range(last + 1)))

        async def first_id(headers: dict[str, Any], query: str = "") -> int:
            out: list[Frame] = []
            await follow(client, path + query, out, lambda f: True, headers=headers)
            return int(out[0]["id"])

        assert await first_id({"Last-Event-ID": "3"}, "?since=10") == 4  # the header wins over `since`
        assert await first_id({"Last-Event-ID": "12"}, "?since=3") == 13
        assert await first_id({}, "?since=0") == 1
        # a Last-Event-ID that is not a seq is ignored: `since` applies, else the whole log is replayed
        for garbage in ("abc", "-1", "3.5", "", "0x10", "9" * 19, b"\xb2", b"\xb9\xb3"):
            assert await first_id({"Last-Event-ID": garbage}, "?since=5") == 6, garbage
            assert await first_id({"Last-Event-ID": garbage}) == 1, garbage
        assert (await client.get(path, params={"since": -1})).status_code == 422


# -- 2. fifty runs, clients dropping at random ---------------------------------------------------------------

RUN = [{"tool_calls": [call(1, 2)]}, {"text": "and more", "tool_calls": [call(3, 4)]}, "The sums are 3 and 7."]


@pytest.mark.slow  # a soak: 50 threads read in short connections dropped at random, ~10 s
async def test_clients_dropping_at_random_rebuild_every_transcript(
    app_factory: Any, serve: Serve, database_url: str
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    count = 50
    app = await app_factory(
        catalog(RUN, chunk_size=4, delay_ms=20), with_worker=True, worker_concurrency=count, db_pool_size=15
    )
    base = await serve(app)
    conn = await db.connect(database_url)
    limits = httpx.Limits(max_connections=2 * count)
    async with httpx.AsyncClient(base_url=base, timeout=20, limits=limits) as client:
        created = await asyncio.gather(*(client.post("/threads", json={"agent": "agent"}) for _ in range(count)))
        tids = [r.json()["id"] for r in created]
        seen: dict[str, list[Frame]] = {tid: [] for tid in tids}
        connections: dict[str, int] = dict.fromkeys(tids, 0)

        async def reader(tid: str) -> None:
            """Read the thread's stream in short connections, each dropped after a few frames or a few ms."""
            out = seen[tid]
            while True:
                connections[tid] += 1
                budget = len(out) + rng.randint(1, 12)
                last = next((f["id"] for f in reversed(out) if "id" in f), None)
                headers = {"Last-Event-ID": last} if last is not None else {}
                done = False

                def stop(frame: Frame, budget: int = budget) -> bool:
                    nonlocal done
                    done = marked(frame)
                    return done or len(out) >= budget

                try:
                    async with asyncio.timeout(rng.uniform(0.01, 0.1) if rng.random() < 0.2 else None):
                        await follow(client, f"/threads/{tid}/events", out, stop, headers)
                except TimeoutError:
                    pass
                if done:
                    return
                await asyncio.sleep(rng.uniform(0.01, 0.05))

        readers = [asyncio.create_task(reader(tid)) for tid in tids]
        try:
            await asyncio.gather(
                *(client.post(f"/threads/{tid}/messages", json={"content": f"sum {i}"}) for i, tid in enumerate(tids))
            )

            async def all_settled() -> bool:
                done = await conn.fetchval(
                    "SELECT count(*) FROM threads WHERE status = 'idle' AND session_turns = 1"
                    " AND lease_owner IS NULL AND runnable_since IS NULL"
                )
                return bool(done == count)

            await wait_for(all_settled, timeout=60)
            ends = {tid: await mark(app, tid) for tid in tids}
            await asyncio.wait_for(asyncio.gather(*readers), 30)
        finally:
            for task in readers:
                task.cancel()
            await conn.close()

        for tid in tids:
            out = seen[tid]
            assert [int(f["id"]) for f in out if "id" in f] == list(range(1, ends[tid] + 1)), f"seed {seed}"
            assert stored_frames(out) == await log_of(app, tid), f"seed {seed}"
            transcript: dict[str, dict[str, Any]] = {}  # message id -> its last `message_data`
            for f in out:
                if f["event"] == "message_data":
                    transcript[f["data"]["message_id"]] = f["data"]["data"]
            history = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
            assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
            assert [normal(m) for m in transcript.values()] == [normal(m) for m in history], f"seed {seed}"
        assert sum(connections.values()) > 3 * count  # the clients really did drop and resume, again and again


# -- 3. across processes ---------------------------------------------------------------------------------------


@pytest.mark.slow  # real API and worker processes
async def test_events_from_a_worker_process_reach_subscribers_of_api_processes(
    database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(
        DATABASE_URL=database_url,
        SECRET_KEY="stream-" + "k" * 40,
        DATA_DIR=str(tmp_path / "data"),
        AGENTS_DIR=str(ROOT / "agents"),
        POLL_INTERVAL="0.1",
    )
    ports = [free_port(), free_port()]
    logs = [tmp_path / "api-0.log", tmp_path / "api-1.log", tmp_path / "worker.log"]
    procs = [start(["api", "--port", str(port)], env, log) for port, log in zip(ports, logs[:2], strict=True)]
    procs.append(start(["worker"], env, logs[2]))
    bases = [f"http://127.0.0.1:{port}" for port in ports]
    conn = await db.connect(database_url)
    try:
        await asyncio.gather(
            *(until_ready(base, proc, log) for base, proc, log in zip(bases, procs[:2], logs[:2], strict=True))
        )
        await wait_for(lambda: asyncio.sleep(0, "started with" in logs[2].read_text()), timeout=30)
        async with (
            httpx.AsyncClient(base_url=bases[0], timeout=20) as one,
            httpx.AsyncClient(base_url=bases[1], timeout=20) as other,
        ):
            tid = (await one.post("/threads", json={"agent": "assistant"})).json()["id"]
            outs: list[list[Frame]] = [[], []]
            readers = [
                asyncio.create_task(follow(c, f"/threads/{tid}/events", out, until_turns(out, 2)))
                for c, out in zip((one, other), outs, strict=True)
            ]
            assert (await one.post(f"/threads/{tid}/messages", json={"content": "hello"})).status_code == 202
            # a frame on each stream proves both subscribed: the second turn's chunks cannot fall before them
            await wait_for(lambda: asyncio.sleep(0, all(turns_in(o) == 1 for o in outs)), timeout=20)
            posted = await other.post(f"/threads/{tid}/messages", json={"content": "what is 6 * 7?"})
            assert posted.status_code == 202
            await asyncio.wait_for(asyncio.gather(*readers), 20)
        stored = [
            (r["seq"], r["type"], json.loads(r["data"]))
            for r in await conn.fetch("SELECT seq, type, data FROM events WHERE thread_id = $1 ORDER BY seq", tid)
        ]
        for out in outs:
            seen = stored_frames(out)  # every stored event up to the second turn's end, once, in order
            assert seen == stored[: len(seen)] and seen[-1][1] == "turn_ended"
            second = out[next(i for i, f in enumerate(out) if f["event"] == "turn_ended") + 1 :]
            chunks = [f for f in second if f["event"] == "message_chunk"]
            assert all("id" not in f for f in chunks)
            assert "".join(f["data"]["chunk"] for f in chunks) == "The answer is 42."
            assert [f["data"]["offset"] for f in chunks] == [0, 8, 16]  # live from the worker, in order
        assert not any("started with" in log.read_text() for log in logs[:2])  # the API processes run no worker
    finally:
        await conn.close()
        for proc, log in zip(procs, logs, strict=True):
            assert stop(proc) == 0, log.read_text()


def turns_in(frames: list[Frame]) -> int:
    return sum(f["event"] == "turn_ended" for f in frames)


async def test_a_delta_of_a_message_the_stream_showed_finished_is_dropped(app_factory: Any, serve: Serve) -> None:
    """A delta announced after the stream replayed its message's completion is stale (a NOTIFY delivered late, or
    buffered while the backlog was read): it would put the text of a finished message after the turn's end."""
    app = await app_factory(catalog([]))
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        async with app.state.runtime.sessions() as session, session.begin():
            done = await messages.add(session, uuid.UUID(tid), "assistant", content="Finished text.")
            streaming = await messages.add(session, uuid.UUID(tid), "assistant", content="", status="pending")
        out: list[Frame] = []
        reader = asyncio.create_task(follow(client, f"/threads/{tid}/events", out, marked))
        await wait_for(lambda: asyncio.sleep(0, len(out) == 2), interval=0.01)  # both messages replayed from the log
        async with app.state.runtime.sessions() as session, session.begin():
            for message_id, chunk in ((done.id, "stale"), (streaming.id, "live")):
                body = {"message_id": str(message_id), "depth": 0, "offset": 0, "chunk": chunk, "attempt": 1}
                notice = {"thread_id": tid, "type": "message_chunk", "data": body}
                await session.execute(select(func.pg_notify(events.CHANNEL, json.dumps(notice))))
        await mark(app, tid)
        await asyncio.wait_for(reader, 20)
    assert [(f["event"], f["data"].get("chunk")) for f in out] == [
        ("message_data", None),
        ("message_data", None),
        ("message_chunk", "live"),
        ("event", None),
    ]


# -- 4. a slow subscriber --------------------------------------------------------------------------------------


async def lagging_stream(base: str, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A GET of `path` on a socket with a small receive window (set before connecting), its body not yet read."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head, head
    return reader, writer


async def read_to_end(reader: asyncio.StreamReader) -> list[Frame]:
    """The rest of a chunked SSE body, parsed into frames; waits for the server to end it."""
    body = b""
    while size := int(await reader.readline(), 16):
        body += (await reader.readexactly(size + 2))[:-2]
    return parse(body)


async def read_cut_off(reader: asyncio.StreamReader) -> list[Frame]:
    """The rest of a chunked SSE body, parsed into frames, up to the connection's end: the server cut it off
    (closed the connection without ending the body)."""
    body, rest = b"", await reader.read()
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        assert int(size, 16), "the body was ended, not cut off"
        body, rest = body + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
    return parse(body)


def parse(body: bytes) -> list[Frame]:
    """An SSE body's frames."""
    frames: list[Frame] = []
    for block in body.decode().split("\r\n\r\n"):
        fields = [line.partition(":") for line in block.split("\r\n") if line and not line.startswith(":")]
        if fields:
            frames.append({k: json.loads(v) if k == "data" else v.strip() for k, _, v in fields})
    return frames


async def test_a_slow_subscriber_is_cut_off_and_resumes_without_loss(app_factory: Any, serve: Serve) -> None:
    app = await app_factory(catalog([]), sse_buffer=24)
    base = await serve(app, sndbuf=4096)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        path = f"/threads/{tid}/events"
        count, pad = 80, "x" * 8_000
        fast: list[Frame] = []
        fast_reader = asyncio.create_task(follow(client, path, fast, until_id(count)))
        slow, connection = await lagging_stream(base, path)
        await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 2), interval=0.01)
        # ~640 kB, far more than the slow stream's socket and write buffers (they took ~27 frames, ~220 kB, on Linux):
        # its sends block, and its 24 slots run over (the hub delivers about one batch per commit). The pace leaves
        # the fast stream, slowed by the same small socket buffer, well ahead (it lagged one delivery at most).
        for i in range(count):
            await mark(app, tid, i=i, pad=pad)
            await asyncio.sleep(0.005)
        assert await asyncio.wait_for(fast_reader, 20)  # a reader that keeps up is never cut off
        assert [int(f["id"]) for f in fast] == list(range(1, count + 1))
        lagging = await asyncio.wait_for(read_to_end(slow), 20)  # now read: the slow stream ends, it was cut off
        connection.close()
        await connection.wait_closed()
        got = [int(f["id"]) for f in lagging]
        assert got == list(range(1, len(got) + 1)), got  # what it did get has no gap
        for i in range(count, count + 5):
            await mark(app, tid, i=i)
        resumed: list[Frame] = []
        assert await follow(client, path, resumed, until_id(count + 5), headers={"Last-Event-ID": str(got[-1])})
        assert stored_frames(lagging + resumed) == await log_of(app, tid)


async def test_a_client_that_stops_reading_is_dropped(app_factory: Any, serve: Serve) -> None:
    timeout = 0.3  # a send to a client that reads waits a few ms at most: far less
    app = await app_factory(catalog([]), sse_send_timeout=timeout)
    base = await serve(app, sndbuf=4096)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        path = f"/threads/{tid}/events"
        count, pad = 40, "x" * 8_000
        reading: list[Frame] = []
        reader = asyncio.create_task(follow(client, path, reading, until_id(count)))
        stalled, connection = await lagging_stream(base, path)  # never read until it was dropped
        await asyncio.sleep(2 * timeout)  # longer than the timeout: a stream with nothing to send waits for nobody
        assert app.state.runtime.hub.subscribers == 2
        for i in range(count):  # ~320 kB, far more than the stalled stream's buffers (~220 kB here): its sends block
            await mark(app, tid, i=i, pad=pad)
        assert await asyncio.wait_for(reader, 20)  # a client that reads is never dropped
        assert [int(f["id"]) for f in reading] == list(range(1, count + 1))
        # the stalled stream is dropped with its subscription (its 1,000 slots never ran over), though nothing read it
        await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 0), interval=0.01)
        dropped = await asyncio.wait_for(read_cut_off(stalled), 10)
        connection.close()
        await connection.wait_closed()
        got = [int(f["id"]) for f in dropped]
        assert got == list(range(1, len(got) + 1)) and len(got) < count, got  # what it got has no gap: it resumes


# -- 5. filters ------------------------------------------------------------------------------------------------


async def test_filters_silent_depth_reasoning_and_unnumbered_chunks(app_factory: Any, serve: Serve) -> None:
    script = [{"text": "Visible answer.", "reasoning": "Thinking hard."}]
    app = await app_factory(catalog(script, chunk_size=4), with_worker=True)
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        async with app.state.runtime.sessions() as session, session.begin():
            whisper = await messages.add(session, uuid.UUID(tid), "user", content="whisper", silent=True)
            deep = await messages.add(session, uuid.UUID(tid), "assistant", content="deep", depth=1)
        hidden = {str(whisper.id), str(deep.id)}
        path = f"/threads/{tid}/events"
        plain: list[Frame] = []
        full: list[Frame] = []
        readers = [
            asyncio.create_task(follow(client, path, plain, marked)),
            asyncio.create_task(follow(client, f"{path}?reasoning=true&include_silent=true&depth=1", full, marked)),
        ]
        # both streams subscribed before the run's live chunks (`full` replays the inserts, `plain` nothing)
        await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 2), interval=0.01)
        await turn(client, tid, "think")
        await mark(app, tid)
        await asyncio.wait_for(asyncio.gather(*readers), 20)
        log = await log_of(app, tid)

        def shown(frames: list[Frame], kind: str) -> str:
            parts = [f for f in frames if f["event"] == kind]
            assert all("id" not in f for f in parts)  # live-only deltas carry no SSE id
            return "".join(f["data"]["chunk"] for f in parts)

        def message_ids(frames: list[Frame]) -> set[str]:
            return {f["data"]["message_id"] for f in frames if f["event"] == "message_data"}

        assert shown(plain, "message_chunk") == shown(full, "message_chunk") == "Visible answer."
        assert shown(plain, "reasoning_chunk") == "" and shown(full, "reasoning_chunk") == "Thinking hard."
        assert stored_frames(full) == log
        unseen = [e for e in log if e[1] == "message_data" and e[2]["message_id"] in hidden]
        assert len(unseen) == 2
        assert stored_frames(plain) == [e for e in log if e not in unseen]
        assert not message_ids(plain) & hidden and hidden <= message_ids(full)

        end = await mark(app, tid)
        for query, visible in (
            ("include_silent=true", {str(whisper.id)}),
            ("depth=1", {str(deep.id)}),
            ("depth=1&include_silent=true", hidden),
        ):
            replayed: list[Frame] = []
            await follow(client, f"{path}?{query}", replayed, until_id(end))
            assert message_ids(replayed) & hidden == visible, query


# -- 6. a revoked key ------------------------------------------------------------------------------------------


async def revoke_with_cli(database_url: str, prefix: str) -> None:
    """`agents keys revoke <prefix>`, as an operator would: another process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "app", "keys", "revoke", prefix),
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0 and b"revoked 1" in out, out.decode()


@pytest.mark.slow  # revokes with `agents keys revoke`, a real process
async def test_a_revoked_key_ends_its_streams(app_factory: Any, serve: Serve, database_url: str) -> None:
    app = await app_factory(catalog([]))
    async with app.state.runtime.sessions() as session, session.begin():
        _, erin = await keys.create(session, "erin")
        _, frank = await keys.create(session, "frank")
    base = await serve(app)
    async with (
        httpx.AsyncClient(base_url=base, timeout=20, headers={"Authorization": f"Bearer {erin}"}) as client,
        httpx.AsyncClient(base_url=base, timeout=20, headers={"Authorization": f"Bearer {frank}"}) as other,
    ):
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        mine: list[Frame] = []
        lifecycle: list[Frame] = []
        kept: list[Frame] = []
        streams = [
            asyncio.create_task(follow(client, f"/threads/{tid}/events", mine, lambda _: False)),
            asyncio.create_task(follow(client, "/events", lifecycle, lambda _: False)),
        ]
        bystander = asyncio.create_task(follow(other, "/events", kept, lambda f: f.get("id") == "2"))
        await wait_for(lambda: asyncio.sleep(0, bool(lifecycle)), interval=0.01)  # `thread_created`, replayed
        await mark(app, tid)
        await wait_for(lambda: asyncio.sleep(0, bool(mine)), interval=0.01)  # both streams are live
        await revoke_with_cli(database_url, erin[:10])
        assert await asyncio.wait_for(asyncio.gather(*streams), 5) == [False, False]  # the server ended them
        assert (await client.get(f"/threads/{tid}")).status_code == 401
        assert (await client.get(f"/threads/{tid}/events")).status_code == 401
        assert not bystander.done()  # another key's stream goes on
        await other.post("/threads", json={"agent": "agent"})
        assert await asyncio.wait_for(bystander, 10)


async def test_streams_of_open_mode_end_when_the_first_key_is_created(app_factory: Any, serve: Serve) -> None:
    """Open mode ends with the first key: streams it opened end too, as a revoked key's do."""
    app = await app_factory(catalog([]))
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        frames: list[Frame] = []
        stream = asyncio.create_task(follow(client, f"/threads/{tid}/events", frames, lambda _: False))
        await mark(app, tid)
        await wait_for(lambda: asyncio.sleep(0, bool(frames)), interval=0.01)  # live
        async with app.state.runtime.sessions() as session, session.begin():
            await keys.create(session, "first")
        assert await asyncio.wait_for(stream, 5) is False  # the server ended it
        assert (await client.get(f"/threads/{tid}/events")).status_code == 401


async def test_a_stream_token_opens_its_own_stream_only_while_young_and_its_key_valid(
    app_factory: Any, serve: Serve
) -> None:
    """`EventSource` cannot send `Authorization`: a token minted with the key opens one stream from the URL."""
    young = 0.5  # a token is used moments (ms) after it is minted: far less
    app = await app_factory(catalog([]), stream_token_seconds=young)
    async with app.state.runtime.sessions() as session, session.begin():
        row, key = await keys.create(session, "ivy")
        _, other_key = await keys.create(session, "jo")
    base = await serve(app)
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        tid = (await client.post("/threads", json={"agent": "agent"}, headers=auth)).json()["id"]
        other = (await client.post("/threads", json={"agent": "agent"}, headers=auth)).json()["id"]
        await mark(app, tid)
        minted = await client.post("/stream-tokens", json={"thread_id": tid}, headers=auth)
        assert minted.status_code == 201 and minted.json()["expires_in"] == young
        token, url = minted.json()["token"], minted.json()["url"]
        assert url == f"/threads/{tid}/events?token={token}"
        frames: list[Frame] = []
        assert await asyncio.wait_for(follow(client, url, frames, marked), 10)  # no header: the token is enough
        for wrong in (f"/threads/{other}/events?token={token}", f"/events?token={token}", f"/threads?token={token}"):
            assert (await client.get(wrong)).status_code == 401, wrong
        assert (await client.get(f"/threads/{tid}/events?token=x{token}")).status_code == 401
        events_token = (await client.post("/stream-tokens", json={}, headers=auth)).json()
        assert events_token["url"] == f"/events?token={events_token['token']}"
        lifecycle: list[Frame] = []
        assert await asyncio.wait_for(follow(client, events_token["url"], lifecycle, lambda _: True), 10)
        someone_else = await client.post(
            "/stream-tokens", json={"thread_id": tid}, headers={"Authorization": f"Bearer {other_key}"}
        )
        assert someone_else.status_code == 404  # not their thread: no token for it
        live: list[Frame] = []
        minted_at = asyncio.get_running_loop().time()
        fresh = (await client.post("/stream-tokens", json={"thread_id": tid}, headers=auth)).json()["url"]
        reading = asyncio.create_task(follow(client, fresh, live, lambda _: False))
        await wait_for(lambda: asyncio.sleep(0, bool(live)), interval=0.01)
        await asyncio.sleep(minted_at + young + 0.05 - asyncio.get_running_loop().time())
        assert (await client.get(fresh)).status_code == 401  # expired: it opens nothing more
        assert not reading.done()  # a stream it opened goes on
        async with app.state.runtime.sessions() as session, session.begin():
            await keys.revoke(session, str(row.id))
        assert await asyncio.wait_for(reading, 10) is False  # until its key is revoked
        late = (await client.post("/stream-tokens", json={"thread_id": tid}, headers=auth)).status_code
        assert late == 401


async def test_the_token_is_read_under_any_spelling_that_decodes_to_its_name(app_factory: Any, serve: Serve) -> None:
    """The server percent-decodes parameter names: `%74oken=` opens the stream as `token=` does (so the log must mask
    it too, `test_tokens.py`); `TOKEN=` is another name, read as nothing; of two `token=`, the last counts."""
    app = await app_factory(catalog([]))
    async with app.state.runtime.sessions() as session, session.begin():
        _, key = await keys.create(session, "ivy")
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        auth = {"Authorization": f"Bearer {key}"}
        tid = (await client.post("/threads", json={"agent": "agent"}, headers=auth)).json()["id"]
        token = (await client.post("/stream-tokens", json={"thread_id": tid}, headers=auth)).json()["token"]
        for query, status in (
            (f"%74oken={token}", 200),
            (f"%74%6F%6B%65%6E={token}", 200),
            (f"token=x&token={token}", 200),
            (f"token={token}&token=x", 401),
            (f"TOKEN={token}", 401),
        ):
            url = httpx.URL(f"{base}/threads/{tid}/events?{query}")
            assert url.query.decode() == query  # sent as spelled
            async with client.stream("GET", url) as response:
                assert response.status_code == status, query


def test_the_access_log_masks_stream_tokens() -> None:
    line = '%s - "%s %s HTTP/%s" %d'
    args = ("127.0.0.1:5", "GET", "/threads/t/events?since=3&token=gAAAA-_x=&depth=1", "1.1", 200)
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, line, args, None)
    assert tokens.Masked().filter(record)
    assert record.getMessage() == '127.0.0.1:5 - "GET /threads/t/events?since=3&token=***&depth=1 HTTP/1.1" 200'
