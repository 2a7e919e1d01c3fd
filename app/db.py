"""Database engine, sessions and raw connections: a `Driver` for plain SQL on a session's connection
(`app/statements.py`) or on one lent `alone`, outside any transaction."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import asyncpg
from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.util import greenlet_spawn

from app import dsn

# Every direct connection plans a prepared statement once and reuses the plan. Postgres' default re-plans each of the
# first five executions per connection, and for good whenever a plan for the given values looks cheaper: the hot
# path's statements are key lookups where that never pays, and planning was most of their server-side cost
# (bench/README.md, "plans"). A pooled connection (`pooled`) prepares nothing to reuse, so it sets nothing: a
# setting sent at connect would stay on whichever server connection the pooler opened, and PgBouncer refuses it.
SERVER_SETTINGS = {"plan_cache_mode": "force_generic_plan"}
PROBE_SECONDS = 5.0  # how long `hears` waits for its own notification (a direct connection hears it in milliseconds)

CONNECT_TIMEOUT = 60.0  # seconds a connection may take to open when neither the URL nor the caller says (asyncpg's)

NUL_REFUSED = "text must not contain NUL (\\u0000) characters"


class Fetcher(Protocol):
    """What runs one statement and returns its rows: an asyncpg connection, or a `Driver`."""

    async def fetch(self, sql: str, /, *args: Any) -> Any: ...


class Driver:
    """An asyncpg connection for the hot path's statements in plain SQL: a session's, under its transaction
    (`statements.driver`), or one lent `alone`.

    asyncpg prepares each statement once per connection and hands rows back as records; SQLAlchemy's compilation,
    cache keys and result processing cost several times the round trip itself, on every statement of every step.
    Errors come out as SQLAlchemy's `DBAPIError` (`orig` the driver's error), like any other statement's.
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return await self._conn.fetch(sql, *args)
        except DRIVER_ERRORS as error:
            raise translated(sql, error) from error

    async def fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        try:
            return await self._conn.fetchrow(sql, *args)
        except DRIVER_ERRORS as error:
            raise translated(sql, error) from error

    async def fetchval(self, sql: str, *args: Any) -> Any:
        try:
            return await self._conn.fetchval(sql, *args)
        except DRIVER_ERRORS as error:
            raise translated(sql, error) from error

    async def execute(self, sql: str, *args: Any) -> None:
        try:
            await self._conn.execute(sql, *args)
        except DRIVER_ERRORS as error:
            raise translated(sql, error) from error


# What a statement on a connection can raise: a database error, or a connection that is closed or in a state no
# statement can be sent on (asyncpg's `InternalClientError`: seen on a pooled connection the database was shutting
# down, "another operation is in progress"); those are the connection's end, not the statement's.
DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.exceptions.InternalClientError, OSError)


def translated(sql: str, error: BaseException) -> exc.DBAPIError:
    """A driver's error as SQLAlchemy's, as its own statements raise them: the connection's end marked invalidated."""
    closed = not isinstance(error, asyncpg.PostgresError)
    return exc.DBAPIError(sql, None, error, connection_invalidated=closed)


def has_nul(value: Any) -> bool:
    """Whether text, or JSON-like data (keys too), holds a NUL character: Postgres can store it in neither `text` nor
    `jsonb`, so it is refused before it reaches the driver."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False


class Unreachable(ConnectionError):
    """No connection to the database could be opened; the message says why in one line, never the password (an
    `OSError`, so whatever waits out a database that is down waits this out too); `dsn` is what asyncpg was given."""

    def __init__(self, message: str, dsn: str = "") -> None:
        super().__init__(message)
        self.dsn = dsn


async def connect(url: str, connect_timeout: float = CONNECT_TIMEOUT, *, pooled: bool = False) -> asyncpg.Connection:
    """A raw asyncpg connection (LISTEN, claims, heartbeats, live deltas) with the engine's server settings, to a
    `DATABASE_URL` in any accepted spelling; it waits `connect_timeout` seconds at most (the URL's, when shorter).
    `pooled`: the URL is a pooler in transaction mode, so nothing is prepared to be reused (`_open`)."""
    target = dsn.target(url)
    return await _open(target, min(connect_timeout, target.timeout or connect_timeout), pooled)


async def hears(url: str, wait: float = PROBE_SECONDS) -> bool:
    """Whether a connection to `url` that LISTENs hears a NOTIFY sent from another connection within `wait`
    seconds: what the API's streams and the workers' wake-ups need. A direct connection (or a pooler in session
    mode, or one that pins a LISTENing connection to its server, as RDS Proxy does) hears it at once; behind a pooler
    in transaction mode the LISTEN stayed on a server connection the client no longer holds, so nothing arrives."""
    channel = f"agents_probe_{uuid.uuid4().hex}"
    heard = asyncio.Event()
    listener = await connect(url, 10, pooled=True)  # nothing prepared: whatever the URL is, the probe itself works
    try:
        await listener.add_listener(channel, lambda *_: heard.set())
        sender = await connect(url, 10, pooled=True)
        try:
            await sender.execute(f"NOTIFY {channel}")
        finally:
            await sender.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(heard.wait(), wait)
        return heard.is_set()
    finally:
        listener.terminate()  # its UNLISTEN would land on whatever server connection a pooler picks


def create_engine(
    url: str, pool_size: int = 10, max_overflow: int | None = None, *, pooled: bool = False
) -> AsyncEngine:
    """An asyncpg engine; JSONB values go through the standard json module.

    Its connections are opened by `_open`, as the raw ones are: SQLAlchemy would hand the URL's query parameters
    (`sslmode`, …) to `asyncpg.connect` as keyword arguments, which it refuses, and cannot parse libpq's several
    hosts (`h1:5432,h2:5432`); so it is given the dialect alone.

    No `pool_pre_ping`: with asyncpg it costs three round trips (BEGIN, a query, ROLLBACK) before every transaction.
    A pooled connection the server closed (a Postgres restart) is noticed for free instead: asyncpg marks it closed
    as soon as the event loop sees the socket close, and the checkout below swaps it for a fresh one. A connection
    that dies while checked out fails its statement, SQLAlchemy then recycles every connection older than it, and the
    engine (`errors.Unavailable`) or the API (503) handles that one failure.

    `pooled`: the URL is a pooler in transaction mode (`DATABASE_DIRECT_URL` is set), where each transaction may run
    on another server connection: neither asyncpg nor SQLAlchemy's dialect keeps a prepared statement (`_open`).
    """
    target = dsn.target(url)
    engine: AsyncEngine | None = None

    def creator() -> Any:  # as `async_creator` would, with the dialect's own statement cache off when pooled
        assert engine is not None
        dbapi: Any = engine.sync_engine.dialect.dbapi
        return dbapi.connect(
            async_creator_fn=lambda: _open(target, target.timeout or CONNECT_TIMEOUT, pooled),
            prepared_statement_cache_size=0 if pooled else 100,
        )

    engine = create_async_engine(
        "postgresql+asyncpg://",
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        creator=creator,
    )
    event.listen(engine.sync_engine, "checkout", _closed_is_disconnected)
    event.listen(engine.sync_engine, "checkin", _closed_when_left_open)
    return engine


async def _open(target: dsn.Target, seconds: float, pooled: bool = False) -> asyncpg.Connection:
    """A connection for `target`. Pooled, asyncpg's statement cache is off: each statement is then parsed as the
    unnamed statement and run in the same exchange (Parse, Describe and Flush, then Bind, Execute and Sync, with no
    Sync between that would let a pooler hand the server connection to another client), so nothing prepared is
    looked for on a server connection that never saw it; and no server setting is sent."""
    try:
        if pooled:
            return await asyncpg.connect(target.dsn, timeout=seconds, statement_cache_size=0)
        return await asyncpg.connect(target.dsn, timeout=seconds, server_settings=SERVER_SETTINGS)
    except (OSError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise Unreachable(" ".join(cause(error, target, seconds).split()), target.dsn) from error


def cause(error: BaseException, target: dsn.Target, timeout: float) -> str:
    """Why a connection could not be opened, in words: the server's own for what it refused (they name the user or
    the database, never the password)."""
    if isinstance(error, socket.gaierror):
        return f"unknown host ({error.strerror})"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: the server's certificate is not trusted ({error.verify_message}); see sslmode and sslrootcert"
    if isinstance(error, ssl.SSLError):
        return f"TLS failed ({error.reason or error})"
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(error, ConnectionRefusedError) or "Connect call failed" in str(error):
        return "connection refused (is the server up, and are the host and port right?)"
    if isinstance(error, OSError) and error.filename:
        return f"cannot read {error.filename} ({error.strerror})"
    if isinstance(error, FileNotFoundError | PermissionError | IsADirectoryError):  # the ssl module names no file
        unreadable = [f"{name}={path}" for name, path in target.files if not os.access(path, os.R_OK)]
        if unreadable:
            return f"cannot read {', '.join(unreadable)} ({error.strerror})"
        return f"no server listens at that socket ({error.strerror})"  # a Unix socket's folder in `host`
    if isinstance(error, asyncpg.ProtocolViolationError) and "startup parameter: plan_cache_mode" in str(error):
        return (
            f"{error} (a PgBouncer: in transaction mode keep DATABASE_URL on it and set DATABASE_DIRECT_URL to a "
            "direct connection; in session mode add plan_cache_mode to its ignore_startup_parameters)"
        )
    if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError):  # a bad password, no such role, pg_hba
        return f"refused: {error}"
    return str(error) or type(error).__name__


def _closed_is_disconnected(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Refuse a pooled connection asyncpg already knows is closed, or one left inside a transaction (`_left_open`);
    the pool retries with a new one."""
    raw = getattr(dbapi_connection, "_connection", None)
    if raw is not None and _left_open(dbapi_connection, raw):
        raw.terminate()
    if raw is not None and raw.is_closed():
        raise exc.DisconnectionError("connection closed by the server")


def _left_open(dbapi_connection: Any, raw: asyncpg.Connection) -> bool:
    """Whether a connection the pool holds is still inside a transaction SQLAlchemy does not know of. A task cancelled
    while its BEGIN was in flight (a worker's drain, a lost lease, a stop) leaves exactly that: asyncpg has taken the
    transaction as begun (`_top_xact`, and the server ran the BEGIN) but SQLAlchemy's adapter never recorded it, so
    the pool's reset rolls nothing back. The next borrower would then run inside it: a one-statement write (an
    answer, a partial text) never committed and its row locks held for good, and a new transaction only a savepoint
    of it. Such a connection is closed (the server rolls its transaction back at once) and never lent again."""
    if getattr(dbapi_connection, "_transaction", None) is not None:
        return False  # a transaction SQLAlchemy knows of: its own commit or rollback ends it
    return getattr(raw, "_top_xact", None) is not None or raw.is_in_transaction()  # asyncpg keeps it private


def _closed_when_left_open(dbapi_connection: Any, record: Any) -> None:
    """At check-in, after the pool's reset: a connection still inside a transaction (`_left_open`) is closed now, so
    the row locks it holds go at once instead of at its next checkout."""
    raw = getattr(dbapi_connection, "_connection", None)
    if raw is not None and not raw.is_closed() and _left_open(dbapi_connection, raw):
        raw.terminate()


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded values after commit (the edge commits, then reads)."""
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def alone(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[Driver]:
    """A pooled connection for statements that are each their own transaction, as a `Driver`: what `autocommit`
    gives, without a session and its connection objects around it (a third of their CPU). A connection that may
    still be running a statement (its caller cut off by a cancellation or a timeout) or is gone is closed and never
    lent again; after anything else (a database error, or the caller's own) it goes back to the pool."""
    engine: AsyncEngine = sessions.kw["bind"]
    proxied = await engine.raw_connection()
    raw = proxied.driver_connection
    assert raw is not None  # just checked out: not invalidated
    try:
        yield Driver(raw)
    except BaseException as error:
        if isinstance(error, asyncio.CancelledError | TimeoutError) or (
            isinstance(error, exc.DBAPIError) and error.connection_invalidated
        ):
            raw.terminate()
            await greenlet_spawn(proxied.invalidate)
        else:
            await greenlet_spawn(proxied.close)
        raise
    await greenlet_spawn(proxied.close)


@asynccontextmanager
async def autocommit(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A session for one atomic statement: no transaction around it (no BEGIN, no COMMIT or ROLLBACK round trip)."""
    async with sessions() as session:
        await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        yield session
