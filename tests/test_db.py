"""`app/db.py` (connections, pools) and the hot path's plain SQL (`app/statements.py`: `Driver`, `insert`, `update`,
`attach`, `write`), on real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
import uuid
from typing import Any

import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import db, errors, keys, messages, migrations, statements, tables, threads
from app.spec import define_agent

AGENT = define_agent(name="a", side_a={"prompt": "p"})


async def _thread(sessions: async_sessionmaker[AsyncSession]) -> uuid.UUID:
    async with sessions() as s, s.begin():
        return (await threads.create(s, AGENT, keys.OPEN)).id


async def test_an_inserted_row_is_persistent_with_its_server_defaults(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    tid = await _thread(sessions)
    async with sessions() as s, s.begin():
        row = await messages.add(s, tid, "user", content="hi", tool_calls=None)
        assert sa_inspect(row).persistent and row in s
        assert row.position > 0 and row.rev > 0 and row.status == "completed" and row.metadata_ == {}
        assert not sa_inspect(row).committed_state  # nothing left for the unit of work to write
    async with sessions() as s:
        stored = (await s.execute(select(tables.Message).where(tables.Message.id == row.id))).scalar_one()
        assert (stored.content, stored.position, stored.tool_calls) == ("hi", row.position, None)


async def test_an_update_writes_only_the_given_columns_and_leaves_them_committed(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    tid = await _thread(sessions)
    async with sessions() as s, s.begin():
        row = await messages.add(s, tid, "assistant", status="pending")
        await messages.save(s, row, status="completed", content="done", usage={"input_tokens": 3})
        assert not sa_inspect(row).committed_state
        assert not s.dirty  # settled: the commit's flush has nothing to visit
    async with sessions() as s:
        stored = await messages.get(s, tid, row.id)
        assert (stored.status, stored.content, stored.usage) == ("completed", "done", {"input_tokens": 3})
        assert stored.rev > row.rev  # the trigger stamped the update


async def test_write_flushes_a_loaded_rows_changes_and_attach_reuses_what_the_session_holds(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    tid = await _thread(sessions)
    async with sessions() as s, s.begin():
        thread = await threads.get(s, tid, keys.OPEN, lock=True)
        assert sa_inspect(thread).persistent
        thread.name, thread.tags = "renamed", ["x"]
        await statements.write(s)
        assert not sa_inspect(thread).committed_state and not s.dirty
        thread.name = "renamed"  # the same value: marked dirty, nothing to write
        assert s.dirty
        await statements.write(s)
        assert not s.dirty
        again = await threads.get(s, tid, keys.OPEN)
        assert again is thread and again.name == "renamed"
    async with sessions() as s:
        stored = await s.get_one(tables.Thread, tid)
        assert (stored.name, stored.tags) == ("renamed", ["x"])


async def test_a_driver_error_is_a_dbapi_error_the_engine_can_classify(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    tid = await _thread(sessions)
    async with sessions() as s, s.begin():
        row = await messages.add(s, tid, "user", content="once")
    async with sessions() as s:
        with pytest.raises(DBAPIError) as caught:
            async with s.begin():
                await messages.add(s, tid, "user", id=row.id, content="twice")
        assert getattr(caught.value.orig, "sqlstate", None) == "23505"
        assert not errors.Unavailable.of(caught.value) and not errors.Contention.of(caught.value)
    async with sessions() as s, s.begin():  # the session's connection went back to the pool clean
        assert len(await messages.history(s, tid)) == 1


async def test_a_row_written_in_a_savepoint_that_rolls_back_shows_what_is_stored(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A row written in plain SQL inside a savepoint stays marked modified, so the savepoint's rollback expires it
    like any row it changed: its rolled-back values are not used."""
    tid = await _thread(sessions)
    async with sessions() as s, s.begin():
        row = await messages.add(s, tid, "assistant", status="pending")
        with contextlib.suppress(RuntimeError):
            async with s.begin_nested():
                await messages.save(s, row, status="completed", content="rolled back")
                raise RuntimeError
        assert {"status", "content"} <= sa_inspect(row).unloaded  # expired: read again before use
        await s.refresh(row)
        assert (row.status, row.content) == ("pending", None)
        await messages.save(s, row, status="completed", content="kept")
        assert not s.dirty  # outside a savepoint a written row is settled


async def test_every_connection_plans_a_statement_once(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    async with sessions() as s:
        assert (await s.execute(text("SHOW plan_cache_mode"))).scalar_one() == "force_generic_plan"
    raw = await db.connect(database_url, connect_timeout=10)
    try:
        assert await raw.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
    finally:
        await raw.close()


async def test_a_pooled_connection_keeps_no_prepared_statement_and_sends_no_setting(database_url: str) -> None:
    """What a pooler in transaction mode needs: no named statement on the server connection (the next transaction
    may run on another one), no setting sent at connect; a direct connection keeps both."""
    prepared = "SELECT count(*) FROM pg_prepared_statements"
    for pooled in (True, False):
        engine = db.create_engine(database_url, 1, pooled=pooled)
        try:
            async with db.sessionmaker(engine)() as s, s.begin():
                for n in (1, 2):
                    assert (await s.execute(text("SELECT CAST(:n AS int) + 1"), {"n": n})).scalar_one() == n + 1
                assert (await (await statements.driver(s)).fetchval("SELECT $1::int", 7)) == 7
                kept = (await s.execute(text(prepared))).scalar_one()
                mode = (await s.execute(text("SHOW plan_cache_mode"))).scalar_one()
        finally:
            await engine.dispose()
        assert (kept, mode) == ((0, "auto") if pooled else (kept or 1, "force_generic_plan")), (pooled, kept, mode)
        raw = await db.connect(database_url, connect_timeout=10, pooled=pooled)
        try:
            await raw.fetchval("SELECT $1::int", 1)
            assert (await raw.fetchval(prepared) == 0) is pooled
        finally:
            await raw.close()


async def test_a_listen_on_a_direct_connection_hears_a_notify(database_url: str) -> None:
    assert await db.hears(database_url)


def _with_query(url: str, **query: str) -> str:
    return url + ("&" if "?" in url else "?") + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)


async def test_a_provider_url_with_libpq_parameters_opens_pools_raw_connections_and_migrates(database_url: str) -> None:
    """SQLAlchemy's asyncpg dialect passed the query to `asyncpg.connect` as keyword arguments (`unexpected keyword
    argument 'sslmode'`); every connection now takes it as libpq does (`prefer`: TLS if offered, which this test
    server need not)."""
    url = _with_query(
        database_url.replace("postgresql+asyncpg://", "postgres://", 1),
        sslmode="prefer",
        application_name="agents-test",
        options="-c work_mem=7MB",
        connect_timeout="5",
    )
    engine = db.create_engine(url, 1)
    try:
        await migrations.upgrade(engine)
        async with engine.connect() as conn:
            found = await conn.execute(text("SELECT current_setting('application_name'), current_setting('work_mem')"))
            assert tuple(found.one()) == ("agents-test", "7MB")
            assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar_one() == "force_generic_plan"
    finally:
        await engine.dispose()
    raw = await db.connect(url)
    try:
        assert (await raw.fetchval("SHOW application_name"), await raw.fetchval("SHOW work_mem")) == (
            "agents-test",
            "7MB",
        )
    finally:
        await raw.close()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"url": "postgresql://postgres@127.0.0.1:1/postgres"},
            "connection refused (is the server up, and are the host and port right?)",
        ),
        (  # libpq's several hosts, which SQLAlchemy's URL parser cannot read: each is tried
            {"url": "postgres://u:hunter2@127.0.0.1:1,127.0.0.1:2/d?target_session_attrs=read-write"},
            "connection refused",
        ),
        ({"database": "no_such_database"}, 'database "no_such_database" does not exist'),
        ({"username": "no_such_role", "password": "hunter2"}, 'refused: role "no_such_role" does not exist'),
        ({"host": "no-such-host.invalid"}, "unknown host"),
        (
            {"query": {"sslmode": "verify-full", "sslrootcert": "/no/such/ca.pem"}},
            "cannot read sslrootcert=/no/such/ca",
        ),
        ({"query": {"options": "-c no_such_setting=1"}}, 'unrecognized configuration parameter "no_such_setting"'),
    ],
)
async def test_a_connection_that_cannot_be_opened_says_why_in_one_line(
    server_url: str, change: dict[str, Any], said: str
) -> None:
    url = change.get("url") or make_url(server_url).set(**change).render_as_string(hide_password=False)
    with pytest.raises(db.Unreachable) as raw:
        await db.connect(url)
    engine = db.create_engine(url, 1)
    try:
        with pytest.raises(db.Unreachable) as pooled:
            await migrations.upgrade(engine)
    finally:
        await engine.dispose()
    for refused in (raw.value, pooled.value):
        assert said in str(refused) and "\n" not in str(refused) and "hunter2" not in str(refused)
        assert errors.Unavailable.of(refused)  # the API answers 503, the engine hands the execution back


async def test_a_connection_busy_with_another_operation_is_unavailable_not_an_internal_error(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """What the database shutting down left on a pooled connection (chaos, a restart): asyncpg refuses any statement
    with "another operation is in progress". That is the connection's end (503 at the API, a retry in the engine),
    at the transaction's BEGIN as at any statement, and the connection is not handed out again."""
    async with sessions() as s:
        connection = await s.connection()
        raw: Any = (await connection.get_raw_connection()).driver_connection
        busy = asyncio.create_task(raw.fetch("SELECT pg_sleep(0.3)"))
        await asyncio.sleep(0.05)
        with pytest.raises(DBAPIError) as begin:
            await statements.driver(s)
        assert begin.value.connection_invalidated and errors.Unavailable.of(begin.value)
        assert connection.invalidated
        with pytest.raises(DBAPIError) as statement:
            await db.Driver(raw).fetchval("SELECT 1")
        assert statement.value.connection_invalidated and errors.Unavailable.of(statement.value)
        busy.cancel()
        with contextlib.suppress(BaseException):
            await busy


async def test_a_connection_whose_begin_was_cancelled_is_never_lent_again(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled while its BEGIN was in flight (a worker's drain, a lost lease): the server ran the BEGIN,
    asyncpg took the transaction as begun, SQLAlchemy's adapter never recorded it, so the pool's reset rolled nothing
    back. Lent again, the connection ran the next borrower's one-statement write inside that transaction, never
    committed, its row locks held for good (found by the soak: a worker hung in its drain). Now the pool closes it at
    check-in and the next borrower gets a fresh connection."""
    engine = db.create_engine(database_url, pool_size=1, max_overflow=0)
    sessions = db.sessionmaker(engine)
    try:
        thread_id = await _thread(sessions)
        async with sessions() as s:
            first: Any = (await s.connection()).sync_connection.connection.driver_connection  # type: ignore[union-attr]
            real = type(first).execute

            async def begun_then_cancelled(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
                done = await real(self, query, *args, **kwargs)  # the server runs the BEGIN ...
                if self is first and query.startswith("BEGIN"):
                    raise asyncio.CancelledError  # ... and the cancellation lands before the caller resumes
                return done

            with monkeypatch.context() as patched:
                patched.setattr(type(first), "execute", begun_then_cancelled)
                with pytest.raises(asyncio.CancelledError):
                    await statements.driver(s)
        async with db.autocommit(sessions) as auto:
            driver = await statements.driver(auto, flush=False)
            await driver.execute("UPDATE threads SET name = 'renamed' WHERE id = $1", thread_id)
            assert (await auto.connection()).sync_connection.connection.driver_connection is not first  # type: ignore[union-attr]
        assert first.is_closed()
        other = await db.connect(database_url, connect_timeout=10)
        try:
            assert await other.fetchval("SELECT name FROM threads WHERE id = $1", thread_id) == "renamed"
            left = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in%'"
            assert await other.fetchval(left) == 0
        finally:
            await other.close()
    finally:
        await engine.dispose()


async def test_alone_runs_each_statement_as_its_own_transaction_and_lends_the_connection_again(
    database_url: str,
) -> None:
    """`db.alone`: a pooled connection with no transaction around its statements; after a statement, or a database
    error, the same connection goes back to the pool and is lent again."""
    engine = db.create_engine(database_url, pool_size=1, max_overflow=0)
    sessions = db.sessionmaker(engine)
    try:
        thread_id = await _thread(sessions)
        async with db.alone(sessions) as driver:
            pid = await driver.fetchval("SELECT pg_backend_pid()")
            await driver.execute("UPDATE threads SET name = 'renamed' WHERE id = $1", thread_id)
            assert await driver.fetchval("SELECT txid_current_if_assigned()") is None  # no transaction held open
        async with sessions() as s:  # committed: another connection's session sees it
            assert (await s.get(tables.Thread, thread_id)).name == "renamed"  # type: ignore[union-attr]
        with pytest.raises(DBAPIError) as refused:
            async with db.alone(sessions) as driver:
                await driver.fetchval("SELECT 1 / 0")
        assert not refused.value.connection_invalidated
        async with db.alone(sessions) as driver:
            assert await driver.fetchval("SELECT pg_backend_pid()") == pid
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()


async def test_alone_never_lends_again_a_connection_cut_off_mid_statement(database_url: str) -> None:
    """A caller cancelled while its statement runs (a lost lease, a stop, a drain) leaves the connection busy with
    it: lent again, the next borrower's statement would fail with "another operation is in progress" (or wait for
    the rest of the first). It is closed instead, and the next borrower gets a fresh one at once."""
    engine = db.create_engine(database_url, pool_size=1, max_overflow=0)
    sessions = db.sessionmaker(engine)
    try:
        started = asyncio.Event()
        pids: list[int] = []

        async def sleeps() -> None:
            async with db.alone(sessions) as driver:
                pids.append(await driver.fetchval("SELECT pg_backend_pid()"))
                started.set()
                await driver.execute("SELECT pg_sleep(30)")

        task = asyncio.create_task(sleeps())
        await started.wait()
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5), db.alone(sessions) as driver:
            assert await driver.fetchval("SELECT pg_backend_pid()") != pids[0]
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1), db.alone(sessions) as driver:
                await driver.execute("SELECT pg_sleep(30)")
        async with asyncio.timeout(5), db.alone(sessions) as driver:
            assert await driver.fetchval("SELECT 1") == 1
        assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()


async def test_alone_hands_out_a_new_connection_after_the_server_closed_one(database_url: str) -> None:
    """A connection the server ended (a restart, `pg_terminate_backend`) is not lent again: found closed in the
    pool, or failing its statement while lent (the database unavailable, to the caller)."""
    engine = db.create_engine(database_url, pool_size=1, max_overflow=0)
    sessions = db.sessionmaker(engine)
    other = await db.connect(database_url, connect_timeout=10)
    try:
        async with db.alone(sessions) as driver:
            pid_before = await driver.fetchval("SELECT pg_backend_pid()")
        await other.execute("SELECT pg_terminate_backend($1)", pid_before)
        await asyncio.sleep(0.1)
        async with db.alone(sessions) as driver:  # the event loop saw the socket close: the checkout replaced it
            pid = await driver.fetchval("SELECT pg_backend_pid()")
            assert pid != pid_before

        async def ended_while_lent() -> None:
            async with db.alone(sessions) as driver:
                assert await driver.fetchval("SELECT pg_backend_pid()") == pid
                await other.execute("SELECT pg_terminate_backend($1)", pid)
                await driver.fetchval("SELECT 1")

        with pytest.raises(DBAPIError) as gone:
            await ended_while_lent()
        assert errors.Unavailable.of(gone.value)
        async with db.alone(sessions) as driver:
            assert await driver.fetchval("SELECT pg_backend_pid()") not in (pid, pid_before)
    finally:
        await other.close()
        await engine.dispose()
