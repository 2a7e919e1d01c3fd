"""End to end over real HTTP: `agents serve` as a subprocess, the example agent, the stream, stored messages."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.processes import free_port, start, stop, until_ready
from tests.test_api import read_events

pytestmark = pytest.mark.slow  # `agents serve` and friends as real processes


@pytest.fixture
def server_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(DATABASE_URL=database_url, DATA_DIR=str(tmp_path / "data"), AGENTS_DIR=str(ROOT / "agents"))
    return env


async def test_a_thread_runs_end_to_end_over_http(server_env: dict[str, str], tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    proc = start(["serve", "--port", str(port)], server_env, log)
    base = f"http://127.0.0.1:{port}"
    try:
        await until_ready(base, proc, log)
        async with httpx.AsyncClient(base_url=base) as client:
            created = await client.post("/threads", json={"agent": "assistant"})
            assert created.status_code == 201
            tid = created.json()["id"]
            posted = await client.post(f"/threads/{tid}/messages", json={"content": "What is 12 * (3 + 4)?"})
            assert posted.status_code == 202
            frames = await asyncio.wait_for(read_events(base, f"/threads/{tid}/events", "turn_ended"), 30)
            assert frames[-1]["data"] == {"side": "a", "reason": "stop_on_response"}
            stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
        assert stored[0]["id"] == posted.json()["message_id"]
        assert stored[1]["tool_calls"][0]["function"]["name"] == "calculate"
        assert stored[2]["content"] == "84" and stored[2]["tool_status"] == "success"
        assert stored[3]["content"] == "The answer is 84."
    finally:
        assert stop(proc) == 0, log.read_text()


async def test_serve_starts_the_embedded_postgres_when_no_url_is_set(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(DATA_DIR=str(tmp_path / "data"), AGENTS_DIR=str(ROOT / "agents"))
    port, log = free_port(), tmp_path / "serve.log"
    proc = start(["serve", "--port", str(port)], env, log)
    try:
        await until_ready(f"http://127.0.0.1:{port}", proc, log, timeout=90)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.post("/threads", json={"agent": "assistant"})).status_code == 201
    finally:
        assert stop(proc) == 0, log.read_text()
    assert (tmp_path / "data" / "pg" / "PG_VERSION").exists()
    # the server stopped its Postgres on exit
    assert not (tmp_path / "data" / "pg" / "postmaster.pid").exists()


async def test_api_and_worker_run_as_separate_processes(server_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    env = {**server_env, "SECRET_KEY": "k" * 48}
    api = start(["api", "--port", str(port)], env, tmp_path / "api.log")
    worker = start(["worker"], env, tmp_path / "worker.log")
    base = f"http://127.0.0.1:{port}"
    try:
        await until_ready(base, api, tmp_path / "api.log")
        async with httpx.AsyncClient(base_url=base) as client:
            tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
            # subscribed before the message: deltas are live only, a stream opened later may have missed them all
            reader = asyncio.create_task(read_events(base, f"/threads/{tid}/events", "turn_ended"))
            await asyncio.sleep(0.5)
            await client.post(f"/threads/{tid}/messages", json={"content": "what time is it"})
            frames = await asyncio.wait_for(reader, 30)
        assert any(f["event"] == "tool_completed" and f["data"]["tool"] == "get_time" for f in frames)
        assert any(f["event"] == "message_chunk" for f in frames)  # deltas cross processes too
    finally:
        assert stop(worker) == 0, (tmp_path / "worker.log").read_text()
        assert stop(api) == 0, (tmp_path / "api.log").read_text()


async def test_sigterm_closes_open_streams_and_exits_cleanly(server_env: dict[str, str], tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    proc = start(["serve", "--port", str(port)], server_env, log)
    base = f"http://127.0.0.1:{port}"
    try:
        await until_ready(base, proc, log)
        async with httpx.AsyncClient(base_url=base) as client:
            tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        follower = asyncio.create_task(read_events(base, f"/threads/{tid}/events", "never"))
        lifecycle = asyncio.create_task(read_events(base, "/events", "never"))
        await asyncio.sleep(0.5)
        assert not follower.done() and not lifecycle.done()
        proc.terminate()
        frames = await asyncio.wait_for(follower, 10)  # the stream ended instead of hanging the shutdown
        assert [f["event"] for f in await asyncio.wait_for(lifecycle, 10)] == ["thread_created"]
        assert frames == []
        assert await asyncio.to_thread(proc.wait, 15) == 0
    finally:
        if proc.poll() is None:
            stop(proc)
