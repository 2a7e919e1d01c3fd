"""Database engine and sessions (the hot path's plain SQL on a session's own connection is `app/statements.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

# Every connection plans a prepared statement once and reuses the plan. Postgres' default re-plans each of the
# first five executions per connection, and for good whenever a plan for the given values looks cheaper: the hot
# path's statements are key lookups where that never pays, and planning was most of their server-side cost
# (bench/README.md, "plans").
SERVER_SETTINGS = {"plan_cache_mode": "force_generic_plan"}

NUL_REFUSED = "text must not contain NUL (\\u0000) characters"


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


async def connect(dsn: str, connect_timeout: float) -> asyncpg.Connection:
    """A raw asyncpg connection (LISTEN, claims, heartbeats, live deltas) with the engine's server settings."""
    return await asyncpg.connect(dsn, timeout=connect_timeout, server_settings=SERVER_SETTINGS)


def create_engine(url: str, pool_size: int = 10, max_overflow: int | None = None) -> AsyncEngine:
    """An asyncpg engine; JSONB values go through the standard json module.

    No `pool_pre_ping`: with asyncpg it costs three round trips (BEGIN, a query, ROLLBACK) before every transaction.
    A pooled connection the server closed (a Postgres restart) is noticed for free instead: asyncpg marks it closed
    as soon as the event loop sees the socket close, and the checkout below swaps it for a fresh one. A connection
    that dies while checked out fails its statement, SQLAlchemy then recycles every connection older than it, and the
    engine (`errors.Unavailable`) or the API (503) handles that one failure.
    """
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        connect_args={"server_settings": SERVER_SETTINGS},
    )
    event.listen(engine.sync_engine, "checkout", _closed_is_disconnected)
    return engine


def worker_pool(worker_concurrency: int) -> tuple[int, int]:
    """Pool size and overflow for a worker: one connection per running execution at most (none holds two), plus
    the claim loop and the timers. All of them stay open once opened: an overflow connection is closed when it
    goes back, and under load that meant a new connection (a Postgres backend, every statement prepared again)
    several times a second."""
    return worker_concurrency + 4, 0


def _closed_is_disconnected(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Refuse a pooled connection asyncpg already knows is closed; the pool retries with a new one."""
    raw = getattr(dbapi_connection, "_connection", None)
    if raw is not None and raw.is_closed():
        raise exc.DisconnectionError("connection closed by the server")


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded values after commit (the edge commits, then reads)."""
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def autocommit(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    """A session for one atomic statement: no transaction around it (no BEGIN, no COMMIT or ROLLBACK round trip)."""
    async with sessions() as session:
        await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        yield session
