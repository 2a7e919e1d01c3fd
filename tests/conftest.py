"""Test fixtures: a real Postgres (DATABASE_URL when set, else an embedded one), a migrated template
database, and a fresh database per test cloned from it (fast, and isolated even across connections)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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
import fastapi.routing
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app import db, dsn, migrations
from app.api.app import create_app
from app.catalog import Catalog
from app.engine.run import llm_http
from app.settings import Settings
from tests import harness

ROOT = Path(__file__).resolve().parent.parent


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many processes `-n auto` (pyproject's addopts) starts: two for the fast set, whose tests mostly wait (on
    Postgres, on a worker), each process with its own databases; none (all in this one) once slow tests are in, which
    time real processes and kill them on purpose, and must not compete for the two cores."""
    return 2 if config.getoption("markexpr") == "not slow" else 0


def _server_url(tmp: Path) -> Iterator[str]:
    if os.environ.get("DATABASE_URL"):
        yield dsn.normalise(os.environ["DATABASE_URL"])
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
    return await db.connect(url)


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


def _database_name() -> str:
    return f"agents_t_{uuid.uuid4().hex[:12]}"


async def _clone(admin: asyncpg.Connection, template_url: str) -> str:
    """A new database from the template; its commits do not wait for the disk (nothing here outlives the suite)."""
    name = _database_name()
    await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{make_url(template_url).database}"')
    await admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    return name


_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"

# Empties every table and sets every sequence back in one round trip, triggers and foreign keys off (`replica`) so
# the order does not matter; the rows the migrations seeded go back as they were (`{seeds}`).
_RESET = f"""
DO $$
DECLARE
    r record;
BEGIN
    SET LOCAL session_replication_role = replica;
    FOR r IN {_TABLES} LOOP
        EXECUTE format('DELETE FROM %I', r.tablename);
    END LOOP;
    FOR r IN SELECT schemaname, sequencename, start_value FROM pg_sequences WHERE last_value IS NOT NULL LOOP
        PERFORM setval(format('%I.%I', r.schemaname, r.sequencename), r.start_value, false);
    END LOOP;
    {{seeds}}
END $$
"""

# What a test must have left alone for its database to be reused: the schema (tables, columns, functions, triggers)
# and the migration it is at.
_SCHEMA = """
SELECT md5(string_agg(item, ',' ORDER BY item)) FROM (
    SELECT c.relname || '.' || c.relkind::text || '.' || coalesce(a.attname || ':' || a.atttypid::text, '') AS item
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE n.nspname = 'public'
    UNION ALL SELECT 'f:' || p.proname || ':' || md5(p.prosrc) FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'
    UNION ALL SELECT 't:' || tgname || ':' || tgrelid::regclass::text FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL SELECT 'v:' || version_num FROM alembic_version
) items
"""

_OTHERS = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"


_TAKING_TURNS = 2  # databases per process: one a test runs on, one being emptied meanwhile


class Databases:
    """The per-test databases of one pytest process. Each test gets a migrated database under a name of its own, as
    if cloned for it; but a clone costs ~0.2 s (far more on a loaded machine), so a database a test is done with is
    emptied and kept under a new name for the next test: the rename also locks out anything the test left running,
    which still knows the old name. A test that changed the schema has its database dropped instead. The emptying
    (~20 ms: a connection, the schema check, the deletes, a vacuum) runs in the background while the next test starts
    on another database: two databases take turns, and a test finding neither free waits for one rather than cloning
    a third."""

    def __init__(self, admin: asyncpg.Connection, template_url: str, reset: str, vacuum: str, schema: str) -> None:
        self._admin = admin
        self._template = template_url
        self._reset = reset
        self._vacuum = vacuum
        self._schema = schema
        self._free: list[str] = []
        self._made = 0  # databases cloned and not dropped
        self._emptying: set[asyncio.Task[None]] = set()
        self._failures: list[BaseException] = []
        self._admin_lock = asyncio.Lock()  # one connection: one statement at a time

    @classmethod
    async def of(cls, server_url: str, template_url: str) -> Databases:
        """Read the template's tables, the rows its migrations seeded, and its schema."""
        conn = await _admin(template_url)
        try:
            tables = [r[0] for r in await conn.fetch(_TABLES)]
            seeds = []
            for table in tables:
                rows = await conn.fetchval(f'SELECT json_agg(t)::text FROM "{table}" t')
                if rows is not None:
                    assert "$$" not in rows, f"a row seeded in {table} that the reset's quoting cannot carry"
                    literal = rows.replace("'", "''")
                    seeds.append(
                        f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, '{literal}');"
                    )
            schema = await conn.fetchval(_SCHEMA)
        finally:
            await conn.close()
        reset = _RESET.replace("{seeds}", "\n    ".join(seeds))
        vacuum = "VACUUM " + ", ".join(tables)  # new rows go in from the first page again, in order, as in a new table
        return cls(await _admin(server_url), template_url, reset, vacuum, schema)

    async def take(self) -> str:
        """A clean database's name."""
        while not self._free and self._emptying and self._made >= _TAKING_TURNS:
            await asyncio.wait(self._emptying, return_when=asyncio.FIRST_COMPLETED)
        if self._failures:  # a database the previous test left could not be given back: say so here
            raise self._failures.pop()
        if self._free:
            return self._free.pop()
        async with self._admin_lock:
            name = await _clone(self._admin, self._template)
        self._made += 1
        return name

    def give_back(self, url: str) -> None:
        """Start emptying the test's database for the next test (in the background)."""
        task = asyncio.create_task(self._give_back(url))
        self._emptying.add(task)
        task.add_done_callback(self._given_back)

    def _given_back(self, task: asyncio.Task[None]) -> None:
        self._emptying.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self._failures.append(error)

    async def _give_back(self, url: str) -> None:
        """End every connection to the test's database, then empty it and keep it under a new name, or drop it."""
        name = make_url(url).database
        assert name is not None
        for _ in range(10):  # something the test left running may connect again meanwhile: end it again
            async with self._admin_lock:
                await self._admin.execute(_OTHERS, name)
            if not await self._emptied(url):
                break
            renamed = _database_name()
            try:
                async with self._admin_lock:
                    await self._admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{renamed}"')
            except asyncpg.ObjectInUseError:
                continue
            self._free.append(renamed)
            return
        async with self._admin_lock:
            await self._admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._made -= 1

    async def _emptied(self, url: str) -> bool:
        """Empty the database if its schema is still the template's; whether it was."""
        conn = await _admin(url)
        try:
            if await conn.fetchval(_SCHEMA) != self._schema:
                return False
            await conn.execute(self._reset)
            await conn.execute(self._vacuum)
        except asyncpg.PostgresError:  # e.g. a role that may not turn triggers off: the next test gets a clone
            return False
        finally:
            await conn.close()
        return True

    async def close(self) -> None:
        while self._emptying:
            await asyncio.wait(self._emptying)
        for name in self._free:
            await self._admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await self._admin.close()


@pytest.fixture(scope="session")
async def databases(server_url: str, template_url: str) -> AsyncIterator[Databases]:
    found = await Databases.of(server_url, template_url)
    yield found
    await found.close()


@pytest.fixture
async def database_url(server_url: str, databases: Databases) -> AsyncIterator[str]:
    """A clean, migrated database of the test's own (the same one emptied and renamed after each test)."""
    url = _with_database(server_url, await databases.take())
    yield url
    databases.give_back(url)


@pytest.fixture
async def fresh_database_url(server_url: str, template_url: str) -> AsyncIterator[str]:
    """A database cloned from the template for this test alone, dropped after it: for a test whose processes may
    outlive it, or that must find the database exactly as the migrations left it."""
    admin = await _admin(server_url)
    try:
        name = await _clone(admin, template_url)
        yield _with_database(server_url, name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


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
        poll_interval=0.05,
        worker_concurrency=4,
        llm_backoff=0.01,
    )


@pytest.fixture(scope="session")
async def llm_client() -> AsyncIterator[httpx.AsyncClient]:
    """The workers' client for LLM providers (`llm_http`), made once: each new one loads the CA bundle for its TLS
    context (~50 ms of CPU), and the tests' workers never reach a provider with it (`no_network`)."""
    async with llm_http() as client:
        yield client


@pytest.fixture
async def app_factory(settings: Settings, llm_client: httpx.AsyncClient) -> AsyncIterator[Any]:
    """Start apps (with their lifespan) on the test database; stopped at teardown. A worker's LLM client is
    `http` when given, else the suite's shared `llm_client`."""
    stacks: list[Any] = []

    async def start(
        catalog: Catalog, *, with_worker: bool = False, http: httpx.AsyncClient | None = None, **overrides: Any
    ) -> FastAPI:
        app = create_app(
            settings.model_copy(update=overrides), catalog, with_worker=with_worker, http=http or llm_client
        )
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        stacks.append(ctx)
        return app

    yield start
    for ctx in reversed(stacks):
        await ctx.__aexit__(None, None, None)


@pytest.fixture
def drive(llm_client: httpx.AsyncClient) -> Callable[[FastAPI], Awaitable[list[uuid.UUID]]]:
    """Run what is runnable on an app started without a worker to its end, in the test's own task (`tests/harness.py`):
    for a test that only needs a turn to have run; the threads run, in order."""

    async def run(app: FastAPI) -> list[uuid.UUID]:
        async with harness.harness(app, llm_client) as engine:
            return await engine.drain()

    return run


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


@pytest.fixture(scope="session", autouse=True)
def routes_built_once() -> Iterator[None]:
    """Every app shares the request handlers the first one built. FastAPI builds an included route's handler (its
    dependencies, its response model's validator) again for every app, at the app's first request: ~0.1 s of CPU per
    app, a fifth of the whole suite's, while every app here includes the same routers the same way. What differs
    between apps is only where dependency overrides are looked up, and no app here has any (nor may it share then)."""
    contexts: Any = getattr(fastapi.routing, "_EffectiveRouteContext", None)
    if contexts is None:  # a FastAPI that builds its routes otherwise: nothing to share
        yield
        return
    build = contexts.from_api_route.__func__
    built: dict[tuple[int, str], Any] = {}

    def shared(cls: type, *, original_route: APIRoute, include_context: Any) -> Any:
        if getattr(include_context.dependency_overrides_provider, "dependency_overrides", None):
            return build(cls, original_route=original_route, include_context=include_context)
        key = (id(original_route), repr(dataclasses.replace(include_context, dependency_overrides_provider=None)))
        found = built.get(key)
        if found is None:
            found = built[key] = build(cls, original_route=original_route, include_context=include_context)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(contexts, "from_api_route", classmethod(shared))
        yield


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any real outbound HTTP request: providers are tested at the wire level with mock transports."""
    original = httpx.AsyncHTTPTransport.handle_async_request

    async def guarded(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.url.host not in ("127.0.0.1", "localhost", "::1"):
            raise RuntimeError(f"a test tried to reach the network: {request.method} {request.url}")
        return await original(self, request)

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", guarded)


class Server(uvicorn.Server):
    """uvicorn's server without its fixed waits, for tests: its loop looks at `should_exit` only every 0.1 s, and its
    shutdown sleeps 0.1 s, then polls its open connections every 0.1 s — a quarter of a second in every teardown.
    This one stops as soon as `exit()` is called and waits for exactly the same things (every connection closed, every
    request's task done) in the same order, polling every few ms: a stream left open still holds it up."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    def exit(self) -> None:
        """Ask it to stop, as a signal would (`should_exit`), waking its loop at once."""
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # the date header, once a second; `should_exit`
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # an idle connection closes; a response under way closes once it ends
        # uvicorn sets no event when its last connection closes: poll
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:  # noqa: ASYNC110
            await asyncio.sleep(0.002)
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def start(self, sockets: list[socket.socket] | None = None) -> asyncio.Task[None]:
        """Serve in a task of its own, once it listens."""
        task = asyncio.create_task(self.serve(sockets))
        await wait_for(lambda: asyncio.sleep(0, self.started or task.done()), interval=0.002)
        if task.done():
            task.result()  # it failed to start: say why
        return task

    async def stop(self, task: asyncio.Task[None], timeout: float = 10) -> None:
        """Stop it, and fail if a connection stays open `timeout` seconds (a stream the test left open)."""
        self.exit()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:  # do not hang the suite on it
            self.force_exit = True
            await task
            raise AssertionError(f"the test server still had open connections {timeout:g} s after shutdown") from None


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[FastAPI], Awaitable[str]]]:
    """Serve started apps on real HTTP (ASGITransport buffers whole responses, so SSE needs a server)."""
    servers: list[tuple[Server, asyncio.Task[None]]] = []

    async def run(app: FastAPI) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        server = Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
        servers.append((server, await server.start()))
        return f"http://127.0.0.1:{port}"

    yield run
    for server, task in servers:
        await server.stop(task)
