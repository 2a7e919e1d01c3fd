"""Backup and restore (issue 36, docs/deployment.md "Backup and restore"): `pg_dump` of a live database, turns
running, restored into a new database and served by new processes. Every thread resumes: the turns the dump caught
in flight finish, a file's bytes are intact, and a stream that saw more than the dump holds resumes with
`events_missed` and the log as stored."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from pgserver._commands import POSTGRES_BIN_PATH  # the wheel's own client programs, as new as its server

from app import db, dsn, migrations
from tests.conftest import _with_database
from tests.processes import free_port, start, stop, until_ready
from tests.test_crash import FIXTURE, SECRET_KEY, read_jsonl
from tests.test_upgrade import answered, has_calls, new_thread, tried, until

pytestmark = pytest.mark.slow  # real processes, pg_dump and pg_restore, a worker killed with -9


def pg_program(name: str, server_major: int) -> str:
    """`name` (pg_dump, pg_restore) of the oldest major version not older than the server's: the system's client
    (Debian's postgresql-client) or the one the `pgserver` wheel ships (always installed: it is a dependency)."""
    found = []
    for program in (shutil.which(name), str(POSTGRES_BIN_PATH / name)):
        if program and Path(program).is_file():
            said = subprocess.run([program, "--version"], capture_output=True, text=True, check=True).stdout
            version = re.search(r"\(PostgreSQL\) (\d+)", said)
            assert version is not None, said
            major = int(version.group(1))
            if major >= server_major:
                found.append((major, program))
    assert found, f"no {name} for a Postgres {server_major} server"
    return min(found)[1]


@pytest.fixture
async def server(server_url: str) -> AsyncIterator[tuple[str, list[str]]]:
    """The server's URL and the databases this test made on it (dropped after)."""
    made: list[str] = []
    yield server_url, made
    admin = await db.connect(server_url)
    try:
        for name in made:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _database(server: tuple[str, list[str]], migrate: bool) -> tuple[str, int]:
    """A new database on the server (migrated, or empty for a restore), and the server's major version."""
    url, made = server
    name = f"agents_rs_{uuid.uuid4().hex[:12]}"
    admin = await db.connect(url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        major = int(await admin.fetchval("SHOW server_version_num")) // 10_000
    finally:
        await admin.close()
    database = _with_database(url, name)
    if migrate:
        engine = db.create_engine(database, 1)
        await migrations.upgrade(engine)
        await engine.dispose()
    return database, major


async def test_a_dump_of_a_live_database_restored_into_a_new_one_resumes_every_thread(
    server: tuple[str, list[str]], tmp_path: Path
) -> None:
    source, major = await _database(server, migrate=True)
    target, _ = await _database(server, migrate=False)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env |= {
        "SECRET_KEY": SECRET_KEY,  # the restored database's secrets need the same key
        "DATA_DIR": str(tmp_path / "data"),
        "AGENTS_DIR": str(FIXTURE),
        "CRASH_DIR": str(tmp_path),
        "LEASE_SECONDS": "2",
        "POLL_INTERVAL": "0.1",
    }
    content = secrets.token_bytes(300_000)  # several chunks of a blob
    port, restored_port = free_port(), free_port()
    base, restored_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{restored_port}"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        api = start(["api", "--port", str(port)], {**env, "DATABASE_URL": source}, tmp_path / "api.log")
        worker = start(["worker"], {**env, "DATABASE_URL": source}, tmp_path / "worker.log")
        processes += [api, worker]
        await until_ready(base, api, tmp_path / "api.log")
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            paused = await new_thread(client, "pause", tmp_path)  # its tool sleeps 3 s
            stored = await client.put(f"/threads/{paused}/fs/data/blob.bin", content=content)
            assert stored.status_code == 201, stored.text
            hung = await new_thread(client, "slow-tool", tmp_path)  # its tool hangs on its first try
            seen: list[dict[str, Any]] = []
            follower = asyncio.create_task(_read(base, paused, {}, seen))
            await until(lambda: has_calls(client, paused), 20, tmp_path)
            await until(lambda: tried(tmp_path), 20, tmp_path)
            dump = tmp_path / "agents.dump"
            await _run(pg_program("pg_dump", major), "-Fc", "-f", str(dump), "-d", dsn.target(source).dsn)
            # the source goes on past the dump: the stream sees the paused turn end; then the source is lost
            await until(lambda: answered(client, paused, "pause: paused"), 20, tmp_path)
            await asyncio.wait_for(follower, 10)
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            assert stop(api) == 0
        await _run(pg_program("pg_restore", major), "--no-owner", "-d", dsn.target(target).dsn, str(dump))
        restored_env = {**env, "DATABASE_URL": target}
        restored_api = start(["api", "--port", str(restored_port)], restored_env, tmp_path / "restored-api.log")
        processes.append(restored_api)
        await until_ready(restored_base, restored_api, tmp_path / "restored-api.log")
        # the client comes back with the last id it saw, past what the dump holds
        last_seen = [f["id"] for f in seen if "id" in f][-1]
        resumed: list[dict[str, Any]] = []
        reader = asyncio.create_task(_read(restored_base, paused, {"Last-Event-ID": last_seen}, resumed))
        await until(lambda: _some(resumed), 10, tmp_path)
        processes.append(start(["worker"], restored_env, tmp_path / "restored-worker.log"))
        async with httpx.AsyncClient(base_url=restored_base, timeout=10) as client:
            await until(lambda: answered(client, paused, "pause: paused"), 30, tmp_path)
            await until(lambda: answered(client, hung, "finished: slept as crashy-agent"), 30, tmp_path)
            assert (await client.get(f"/threads/{paused}/fs/data/blob.bin")).content == content
        await asyncio.wait_for(reader, 10)
        conn = await asyncpg.connect(dsn.target(target).dsn)
        try:
            logged = [
                r["seq"] for r in await conn.fetch("SELECT seq FROM events WHERE thread_id = $1", uuid.UUID(paused))
            ]
        finally:
            await conn.close()
        # the dump was older than what the client saw: it is told, and gets the log as stored, then what follows
        assert resumed[0] == {"event": "events_missed", "data": {"oldest_seq": 1}}
        ids = [int(f["id"]) for f in resumed[1:] if "id" in f]  # live text deltas have none
        assert ids == sorted(logged)[: len(ids)] and ids[0] == 1 and resumed[-1]["event"] == "turn_ended"
        assert len(read_jsonl(tmp_path / "pause.jsonl")) == 2  # the paused tool ran again after the restore
    finally:
        for proc in processes:
            if proc.poll() is None:
                stop(proc)


async def _run(*command: str) -> None:
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{command[0]}: {done.stderr}"


async def _some(frames: list[dict[str, Any]]) -> bool:
    return bool(frames)


async def _read(base: str, tid: str, headers: dict[str, str], out: list[dict[str, Any]]) -> None:
    """Append the thread's SSE frames (with an `event`) to `out` until a `turn_ended`."""
    frame: dict[str, Any] = {}
    async with (
        httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(10, read=60)) as client,
        client.stream("GET", f"/threads/{tid}/events", headers=headers) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line and not line.startswith(":"):
                key, _, value = line.partition(":")
                frame[key] = json.loads(value) if key == "data" else value.strip()
            elif not line and "event" in frame:
                out.append(frame)
                if frame["event"] == "turn_ended":
                    return
                frame = {}
