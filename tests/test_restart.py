"""R4: Postgres restarted in the middle of runs. The API answers 503 while it is down, the worker and the API's event
listener reconnect, and the interrupted runs finish from what is stored; an SSE client resumes without a gap."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app import db, dsn, migrations
from bench.harness import PrivatePostgres
from tests.conftest import outside_pytest_temp
from tests.processes import free_port, start, stop, until_ready
from tests.test_crash import FIXTURE, SECRET_KEY, read_jsonl

pytestmark = pytest.mark.slow  # real processes on a Postgres of its own, restarted mid-run


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    for folder in outside_pytest_temp():
        pg = PrivatePostgres(folder / "pg")
        try:
            yield pg
        finally:
            pg.cleanup()


async def test_a_database_restart_mid_run_is_waited_out_and_the_runs_finish(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    engine = db.create_engine(dsn.normalise(private_pg.url), 1)
    await migrations.upgrade(engine)
    await engine.dispose()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(
        DATABASE_URL=private_pg.url,
        SECRET_KEY=SECRET_KEY,
        DATA_DIR=str(tmp_path / "data"),
        AGENTS_DIR=str(FIXTURE),
        CRASH_DIR=str(tmp_path),
        LEASE_SECONDS="2",
        POLL_INTERVAL="0.1",
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = start(["api", "--port", str(port)], env, tmp_path / "api.log")
    worker = start(["worker"], env, tmp_path / "worker.log")
    try:
        await until_ready(base, api, tmp_path / "api.log")
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            ids = []
            for _ in range(3):
                created = await client.post("/threads", json={"agent": "crashy"})
                ids.append(created.json()["id"])
                assert (await client.post(f"/threads/{ids[-1]}/messages", json={"content": "pause"})).status_code == 202
            seen: list[int] = []
            follower = asyncio.create_task(_follow(base, ids[0], seen))

            async def pausing() -> bool:
                rows = await client.get(f"/threads/{ids[0]}/messages")
                return any(m["tool_calls"] for m in rows.json()["messages"])

            await _until(pausing, 20)
            await asyncio.to_thread(private_pg.stop)  # the tools are sleeping: their results cannot be stored
            down = await client.get(f"/threads/{ids[0]}")
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "database_unavailable"
            assert (await client.get("/ready")).status_code == 503
            await asyncio.sleep(4)  # past the tools' end and two leases
            await asyncio.to_thread(private_pg.start)

            async def settled() -> bool:
                for tid in ids:
                    body = (await client.get(f"/threads/{tid}")).json()
                    if body.get("status") != "idle":
                        return False
                return True

            await _until(settled, 40)
            for tid in ids:
                rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
                assert rows[-1]["content"] == "pause: paused", rows
                assert all(m["status"] == "completed" for m in rows)
            posted = await client.post(f"/threads/{ids[0]}/messages", json={"content": "pause again"})
            assert posted.status_code == 202  # a new message after the restart runs too

            async def answered() -> bool:
                rows = (await client.get(f"/threads/{ids[0]}/messages")).json()["messages"]
                return len(rows) == 8 and rows[-1]["status"] == "completed"

            await _until(answered, 20)
            await asyncio.sleep(1)
            follower.cancel()
        conn = await asyncpg.connect(private_pg.url)
        try:
            logged = [
                r["seq"] for r in await conn.fetch("SELECT seq FROM events WHERE thread_id = $1 ORDER BY seq", ids[0])
            ]
        finally:
            await conn.close()
        assert seen == logged  # the stream was cut at the restart and resumed: no gap, no duplicate
    finally:
        for proc in (worker, api):
            if proc.poll() is None:
                stop(proc)
    assert len(read_jsonl(tmp_path / "pause.jsonl")) >= 3


async def _until(predicate: Any, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            if await predicate():
                return
        except (httpx.TransportError, KeyError, ValueError):
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.2)


async def _follow(base: str, tid: str, seen: list[int]) -> None:
    """Follow the thread's events for ever, resuming with `Last-Event-ID` whenever the stream ends or fails."""
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(5, read=None)) as client:
        while True:
            headers = {"Last-Event-ID": str(seen[-1])} if seen else {}
            try:
                async with client.stream("GET", f"/threads/{tid}/events", headers=headers) as response:
                    if response.status_code != 200:
                        await asyncio.sleep(0.2)
                        continue
                    async for line in response.aiter_lines():
                        if line.startswith("id:") and line[3:].strip():
                            seen.append(int(line[3:].strip()))
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
