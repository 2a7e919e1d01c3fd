"""Behind PgBouncer in transaction mode (Debian's, started here in front of the suite's Postgres): `agents api` and
`agents worker` with `DATABASE_URL` on the pooler and `DATABASE_DIRECT_URL` direct answer threads and stream them
live; without the direct URL each refuses to start in one line (exit 2)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from app import db
from bench.harness import PgBouncer
from tests.conftest import outside_pytest_temp
from tests.processes import free_port, start, stop, until_ready
from tests.test_cli import agents

pytestmark = pytest.mark.slow  # a PgBouncer of its own, and real processes

AGENT = "from app.spec import define_agent\ndefine_agent(name='a', side_a={'prompt': 'p', 'stop_on_response': True})\n"
PROMPT = "from app.spec import define_prompt\ndefine_prompt(name='p', model='m', prompt='be brief')\n"
MODEL = "from app.spec import define_model\ndefine_model(name='m', provider='test', script=['hello via pgbouncer'])\n"
THREADS = 6  # turns at once: transactions of several clients share the pooler's server connections


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").is_file():
        pytest.skip("needs Debian's pgbouncer (apt-get install -y pgbouncer; .ci/run installs it)")
    for folder in outside_pytest_temp():
        pooler = PgBouncer(server_url, folder, pool_size=4)  # fewer server connections than clients
        try:
            yield pooler
        finally:
            pooler.stop()


def _agents_dir(tmp_path: Path) -> Path:
    root = tmp_path / "agents"
    for folder, source in (("agents", AGENT), ("prompts", PROMPT), ("models", MODEL)):
        (root / folder).mkdir(parents=True)
        (root / folder / "a.py").write_text(source)
    return root


def _env(pooled: str, direct: str | None, tmp_path: Path) -> dict[str, str]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DATABASE_DIRECT_URL", "SECRET_KEY")},
        "DATABASE_URL": pooled,
        "AGENTS_DIR": str(_agents_dir(tmp_path)),
        "DATA_DIR": str(tmp_path / "data"),
        "LEASE_SECONDS": "3",  # a heartbeat (one transaction through the pooler) every second
    }
    if direct is not None:
        env["DATABASE_DIRECT_URL"] = direct
    return env


async def _answered_live(client: httpx.AsyncClient) -> None:
    """A thread's stream, opened before its message is posted, carries the assistant's answer."""
    tid = (await client.post("/threads", json={"agent": "a"})).json()["id"]
    said: list[str] = []

    async def follow() -> None:
        async with client.stream("GET", f"/threads/{tid}/events") as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:") and "hello via pgbouncer" in line:
                    said.append(line)
                    return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.5)  # subscribed before anything happens: what arrives came live
    posted = await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
    assert posted.status_code in (200, 202), posted.text
    await asyncio.wait_for(follower, 30)
    assert said


async def test_a_turn_through_pgbouncer_in_transaction_mode_with_a_direct_url_for_sessions(
    bouncer: PgBouncer, fresh_database_url: str, tmp_path: Path
) -> None:
    name = make_url(fresh_database_url).database
    assert name is not None
    env = _env(bouncer.url(name), fresh_database_url, tmp_path)
    port = free_port()
    api_log, worker_log = tmp_path / "api.log", tmp_path / "worker.log"
    api = start(["api", "--port", str(port)], env, api_log)
    worker = start(["worker", "--concurrency", "4"], env, worker_log)
    try:
        base = f"http://127.0.0.1:{port}"
        await until_ready(base, api, api_log)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            await asyncio.gather(*(_answered_live(client) for _ in range(THREADS)))
            created = await client.post("/threads", json={"agent": "a"})
            tid = created.json()["id"]
            posted = await client.post(f"/threads/{tid}/messages", json={"content": "hi"}, params={"wait": 30})
            assert posted.status_code == 200 and posted.json()["done"], posted.text
        assert worker.poll() is None, worker_log.read_text()
    finally:
        assert stop(worker) == 0, worker_log.read_text()
        assert stop(api) == 0, api_log.read_text()
    logs = api_log.read_text() + worker_log.read_text()
    assert "prepared statement" not in logs and "Traceback" not in logs, logs
    opened = [line for line in bouncer.log.read_text().splitlines() if f" {name}/" in line and "new connection" in line]
    assert opened, "the pooler opened no server connection to the database"


@pytest.mark.parametrize("command", ["api", "worker"])
def test_without_the_direct_url_the_pooler_is_named_in_one_line(
    bouncer: PgBouncer, fresh_database_url: str, tmp_path: Path, command: str
) -> None:
    name = make_url(fresh_database_url).database
    assert name is not None
    result = agents(command, env=_env(bouncer.url(name), None, tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "is a connection pooler in transaction mode" in lines[0] and "DATABASE_DIRECT_URL" in lines[0], lines


def test_a_command_that_does_not_listen_says_what_the_pooler_needs(
    bouncer: PgBouncer, fresh_database_url: str, tmp_path: Path
) -> None:
    name = make_url(fresh_database_url).database
    assert name is not None
    result = agents("keys", "list", env=_env(bouncer.url(name), None, tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert "cannot connect to DATABASE_URL" in result.stderr and "set DATABASE_DIRECT_URL" in result.stderr


def test_a_direct_url_that_is_the_pooler_too_is_refused(
    bouncer: PgBouncer, fresh_database_url: str, tmp_path: Path
) -> None:
    name = make_url(fresh_database_url).database
    assert name is not None
    result = agents("worker", env=_env(bouncer.url(name), bouncer.url(name), tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "DATABASE_DIRECT_URL" in result.stderr and "is not a direct connection" in result.stderr, result.stderr


async def test_a_listen_through_the_pooler_hears_nothing_and_a_direct_one_does(
    bouncer: PgBouncer, fresh_database_url: str
) -> None:
    name = make_url(fresh_database_url).database
    assert name is not None
    assert await db.hears(fresh_database_url)
    assert not await db.hears(bouncer.url(name), wait=1)
    conn = await db.connect(bouncer.url(name), pooled=True)  # statements with arguments, no prepared statement kept
    try:
        assert await conn.fetchval("SELECT $1::int + 1", 1) == 2
        assert await conn.fetchval("SELECT $1::int + 1", 2) == 3
    finally:
        await conn.close()
