"""Upgrades without downtime (issue 36, ARCHITECTURE.md "Migrations"): the previous release's `agents api` and
`agents worker` keep serving while the database is migrated to this release's newest migration under a turn in
flight, and this release's processes take the previous release's threads over, a turn in flight included; a
schema this release does not run on is refused by name.

The previous release is the commit before the one that added the newest migration: the code that still runs when
that migration is applied. Its `app/`, `migrations/` and test agents are taken out of git (`git archive`) into a
temporary folder and run with this virtualenv's packages (`PYTHONPATH`), so the test needs the repository's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app import db, migrations
from tests.conftest import ROOT, _with_database
from tests.processes import free_port, start, stop, until_ready
from tests.test_crash import FIXTURE, SECRET_KEY, read_jsonl

pytestmark = pytest.mark.slow  # two releases' real processes, one killed with -9

CRASH_AGENTS = Path("tests/fixtures/agents_crash")


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr.strip()} (the test needs the full history)"
    return done.stdout.strip()


def previous_release() -> str:
    """The commit before the one that added the newest migration file."""
    added = _git("log", "--diff-filter=A", "-1", "--format=%H", "--", "migrations/versions")
    assert added, "no commit added a migration: the test needs the repository's history (not a shallow clone)"
    return _git("rev-parse", f"{added}^")


def checkout(commit: str, folder: Path) -> Path:
    """`app/`, `migrations/` and the crash tests' agents of `commit`, in `folder`."""
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "app", "migrations", str(CRASH_AGENTS)],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def revisions(tree: Path) -> set[str]:
    """The migrations a source tree knows, from its scripts' `revision` lines."""
    found = (re.search(r'^revision: str = "([^"]+)"', p.read_text(), re.M) for p in tree.glob("migrations/versions/*"))
    return {m.group(1) for m in found if m}


def start_old(old: Path, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m app <args>` of the previous release: its source first on the path, this virtualenv's packages."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app", *args],
            cwd=old,
            env={**env, "PYTHONPATH": str(old), "AGENTS_DIR": str(old / CRASH_AGENTS)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def migrate(env: dict[str, str], old: Path | None = None) -> str:
    """`agents migrate` of this release (or of the previous one, from `old`); what it printed."""
    extra = {"PYTHONPATH": str(old)} if old else {}
    done = subprocess.run(
        [sys.executable, "-m", "app", "migrate"],
        cwd=old or ROOT,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
async def database(server_url: str) -> AsyncIterator[str]:
    """An empty database of this test's own (the previous release migrates it), dropped after."""
    name = f"agents_up_{uuid.uuid4().hex[:12]}"
    admin = await db.connect(server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield _with_database(server_url, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_the_previous_release_runs_on_the_new_schema_and_this_one_takes_its_turns_over(
    database: str, tmp_path: Path
) -> None:
    old = checkout(previous_release(), tmp_path / "previous")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY", "AGENTS_DIR", "PYTHONPATH")}
    env |= {
        "DATABASE_URL": database,
        "SECRET_KEY": SECRET_KEY,
        "DATA_DIR": str(tmp_path / "data"),
        "CRASH_DIR": str(tmp_path),
        "LEASE_SECONDS": "2",
        "POLL_INTERVAL": "0.1",
    }
    migrate(env, old)
    conn = await asyncpg.connect(database.replace("postgresql+asyncpg://", "postgresql://", 1))
    processes: list[subprocess.Popen[bytes]] = []
    old_port, new_port = free_port(), free_port()
    old_base, new_base = f"http://127.0.0.1:{old_port}", f"http://127.0.0.1:{new_port}"
    try:
        old_api = start_old(old, ["api", "--port", str(old_port)], env, tmp_path / "old-api.log")
        old_worker = start_old(old, ["worker"], env, tmp_path / "old-worker.log")
        processes += [old_api, old_worker]
        await until_ready(old_base, old_api, tmp_path / "old-api.log")
        async with httpx.AsyncClient(base_url=old_base, timeout=10) as client:
            # a turn of the previous release in flight (its tool sleeps 3 s) while this release migrates
            paused = await new_thread(client, "pause", tmp_path)
            await until(lambda: has_calls(client, paused), 20, tmp_path)
            said = migrate(env)
            assert "database is at the latest migration" in said
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == migrations.head()
            runs_with = await conn.fetchval(
                "SELECT runs_with FROM schema_compat WHERE revision = $1", migrations.head()
            )
            assert runs_with in revisions(old), "the newest migration does not say the previous release runs on it"
            if "schema_compat" in (old / "app" / "migrations.py").read_text():  # a release that reads it says so
                assert (await client.get("/ready")).status_code == 200
            # the previous release finishes that turn, and runs a new one, on the migrated schema
            await until(lambda: answered(client, paused, "pause: paused"), 20, tmp_path)
            tool = await new_thread(client, "slow-tool", tmp_path)
            await until(lambda: tried(tmp_path), 20, tmp_path)
            assert {r["pid"] for r in read_jsonl(tmp_path / "tools.jsonl")} == {old_worker.pid}
            seen: list[int] = []
            bases = [old_base]
            follower = asyncio.create_task(_follow(bases, tool, seen))
            # this release's processes join; the previous release's worker dies mid-tool and its API stops
            new_api = start(["api", "--port", str(new_port)], {**env, "AGENTS_DIR": str(FIXTURE)}, tmp_path / "api.log")
            new_worker = start(["worker"], {**env, "AGENTS_DIR": str(FIXTURE)}, tmp_path / "worker.log")
            processes += [new_api, new_worker]
            await until_ready(new_base, new_api, tmp_path / "api.log")
            old_worker.send_signal(signal.SIGKILL)
            old_worker.wait(10)
            bases.append(new_base)
            assert stop(old_api) == 0
        async with httpx.AsyncClient(base_url=new_base, timeout=10) as client:
            await until(lambda: answered(client, tool, "finished: slept as crashy-agent"), 30, tmp_path)
            assert {r["pid"] for r in read_jsonl(tmp_path / "tools.jsonl")} == {old_worker.pid, new_worker.pid}
            # the previous release's thread goes on under this release
            assert (await client.post(f"/threads/{paused}/messages", json={"content": "again"})).status_code == 202
            await until(lambda: answered(client, paused, "pause: paused", count=8), 20, tmp_path)
            logged = [
                r["seq"] for r in await conn.fetch("SELECT seq FROM events WHERE thread_id = $1", uuid.UUID(tool))
            ]
            await until(lambda: _caught_up(seen, max(logged)), 10, tmp_path)
            follower.cancel()
            assert seen == sorted(logged)  # one stream, across both releases' APIs: no gap, no duplicate
            # a newer release's migration that says this release runs on it: served, and `agents migrate` leaves it
            await conn.execute("UPDATE alembic_version SET version_num = '9999'")
            await conn.execute("UPDATE schema_compat SET revision = '9999', runs_with = $1", migrations.head())
            assert (await client.get("/ready")).status_code == 200
            assert await _command("migrate", env) == (
                0,
                f"database is at migration 9999, newer than this release's {migrations.head()}, which runs on it\n",
            )
            # one that does not: `/ready`, `agents migrate` and a new worker refuse it by name
            await conn.execute("UPDATE schema_compat SET runs_with = '9998'")
            refused = await client.get("/ready")
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "schema_unknown", refused.text
        for command in ("migrate", "worker"):
            code, said = await _command(command, env)
            assert code == 1 and "error: The database is at migration 9999, which this release" in said, said
    finally:
        for proc in processes:
            if proc.poll() is None:
                stop(proc)
        await conn.close()


async def _command(command: str, env: dict[str, str]) -> tuple[int, str]:
    """`agents <command>` of this release: its exit code, and stdout (or stderr when it failed)."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", command],
        cwd=ROOT,
        env={**env, "AGENTS_DIR": str(FIXTURE)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout if done.returncode == 0 else done.stderr


async def new_thread(client: httpx.AsyncClient, content: str, crash_dir: Path) -> str:
    """A `crashy` thread (tests/fixtures/agents_crash) with `content` posted; its id."""
    created = await client.post("/threads", json={"agent": "crashy", "env": {"CRASH_DIR": str(crash_dir)}})
    assert created.status_code == 201, created.text
    tid: str = created.json()["id"]
    assert (await client.post(f"/threads/{tid}/messages", json={"content": content})).status_code == 202
    return tid


async def has_calls(client: httpx.AsyncClient, tid: str) -> bool:
    """Whether the thread's model answered with tool calls (its tool is running, or ran)."""
    rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    return any(m["tool_calls"] for m in rows)


async def answered(client: httpx.AsyncClient, tid: str, text: str, count: int = 4) -> bool:
    """Whether the thread is idle with `count` messages, all completed, the last one `text`."""
    thread = (await client.get(f"/threads/{tid}")).json()
    rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    return (
        thread["status"] == "idle"
        and len(rows) == count
        and rows[-1]["content"] == text
        and all(m["status"] == "completed" for m in rows)
    )


async def tried(crash_dir: Path) -> bool:
    """Whether `slow_tool` started (it hangs on its first try)."""
    return bool(read_jsonl(crash_dir / "tools.jsonl"))


async def _caught_up(seen: list[int], last: int) -> bool:
    return bool(seen) and seen[-1] == last


async def until(predicate: Any, timeout: float, folder: Path) -> None:
    """Poll until `predicate()` is true; fail with the processes' logs after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        with contextlib.suppress(httpx.TransportError, KeyError, ValueError):  # not up, or not answering yet
            if await predicate():
                return
        if asyncio.get_running_loop().time() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.glob("*.log")))
            raise AssertionError(f"condition not reached in {timeout} s\n{logs}")
        await asyncio.sleep(0.1)


async def _follow(bases: list[str], tid: str, seen: list[int]) -> None:
    """Follow the thread's events on the newest of `bases`, resuming there with `Last-Event-ID` whenever the
    stream ends or fails."""
    while True:
        headers = {"Last-Event-ID": str(seen[-1])} if seen else {}
        with contextlib.suppress(httpx.TransportError):  # its API was stopped: resume on the newest
            async with (
                httpx.AsyncClient(base_url=bases[-1], timeout=httpx.Timeout(5, read=None)) as client,
                client.stream("GET", f"/threads/{tid}/events", headers=headers) as response,
            ):
                if response.status_code == 200:
                    async for line in response.aiter_lines():
                        if line.startswith("id:") and line[3:].strip():
                            seen.append(int(line[3:]))
        await asyncio.sleep(0.1)
