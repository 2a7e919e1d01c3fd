"""Test fixtures: a real Postgres (DATABASE_URL when set, else an embedded one), a migrated template
database, and a fresh database per test cloned from it (fast, and isolated even across connections)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app import db, migrations
from app.api.app import create_app
from app.catalog import Catalog
from app.settings import Settings, normalise_url, plain_url

ROOT = Path(__file__).resolve().parent.parent


def _server_url(tmp: Path) -> Iterator[str]:
    if os.environ.get("DATABASE_URL"):
        yield normalise_url(os.environ["DATABASE_URL"])
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server  # where it is defined: the package does not re-export it

        server = get_server(tmp / "pg", cleanup_mode="stop")
    try:
        yield f"postgresql+asyncpg://postgres@/postgres?host={tmp / 'pg'}"
    finally:
        server.cleanup()


def outside_pytest_temp() -> Iterator[Path]:
    """A folder for an embedded Postgres outside pytest's own: pgserver opens the folders above its data to its
    system user, and every pytest session that starts closes `/tmp/pytest-of-<user>` again (0700), which stopped the
    Postgres of any suite already running beside it."""
    folder = Path(tempfile.mkdtemp(prefix="agents-test-pg-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """The Postgres server the suite uses (any database on it; tests make their own)."""
    for folder in outside_pytest_temp():
        yield from _server_url(folder)


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def _admin(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(plain_url(url))


@pytest.fixture(scope="session")
async def template_url(server_url: str) -> AsyncIterator[str]:
    """A database migrated once, cloned by every test that needs one."""
    name = f"agents_tpl_{os.getpid()}"
    conn = await _admin(server_url)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await conn.execute(f'CREATE DATABASE "{name}"')
    url = _with_database(server_url, name)
    engine = db.create_engine(url, 1)
    await migrations.upgrade(engine)
    await engine.dispose()
    yield url
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await conn.close()


@pytest.fixture
async def database_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    """A fresh, migrated database for one test."""
    name = f"agents_t_{uuid.uuid4().hex[:12]}"
    template = make_url(template_url).database
    conn = await _admin(server_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        yield _with_database(server_url, name)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on the test's own database (a pool of 5)."""
    engine: AsyncEngine = db.create_engine(database_url, 5)
    yield db.sessionmaker(engine)
    await engine.dispose()


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        agents_dir=ROOT / "agents",
        data_dir=tmp_path / "data",
        secret_key="test-" + "k" * 40,
        lease_seconds=5,
        poll_interval=0.2,
        worker_concurrency=4,
        llm_backoff=0.01,
    )


@pytest.fixture
async def app_factory(settings: Settings) -> AsyncIterator[Any]:
    """Start apps (with their lifespan) on the test database; stopped at teardown."""
    stacks: list[Any] = []

    async def start(
        catalog: Catalog, *, with_worker: bool = False, http: httpx.AsyncClient | None = None, **overrides: Any
    ) -> FastAPI:
        app = create_app(settings.model_copy(update=overrides), catalog, with_worker=with_worker, http=http)
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        stacks.append(ctx)
        return app

    yield start
    for ctx in reversed(stacks):
        await ctx.__aexit__(None, None, None)


def client_for(app: FastAPI, key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost", headers=headers)


async def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll an async predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any real outbound HTTP request: providers are tested at the wire level with mock transports."""
    original = httpx.AsyncHTTPTransport.handle_async_request

    async def guarded(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.url.host not in ("127.0.0.1", "localhost", "::1"):
            raise RuntimeError(f"a test tried to reach the network: {request.method} {request.url}")
        return await original(self, request)

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", guarded)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[FastAPI], Awaitable[str]]]:
    """Serve started apps on real HTTP (ASGITransport buffers whole responses, so SSE needs a server)."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def run(app: FastAPI) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
        servers.append((server, asyncio.create_task(server.serve())))
        await wait_for(lambda: asyncio.sleep(0, server.started))
        return f"http://127.0.0.1:{port}"

    yield run
    for server, task in servers:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except TimeoutError:  # a stream a test left open: do not hang the suite on it
            server.force_exit = True
            await task
            raise AssertionError("the test server still had open connections 10 s after shutdown") from None
