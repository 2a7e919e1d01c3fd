"""Database engine and sessions, migrations, and the embedded Postgres for a fresh machine."""

from __future__ import annotations

import logging
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, event, exc, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.settings import Settings

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
MIGRATION_LOCK = 7_316_001  # pg_advisory_xact_lock key: replicas never migrate at once


def create_engine(url: str, pool_size: int = 10, max_overflow: int | None = None) -> AsyncEngine:
    """An asyncpg engine; JSONB values go through the standard json module.

    No `pool_pre_ping`: with asyncpg it costs three round trips (BEGIN, a query, ROLLBACK) before every transaction.
    A pooled connection the server closed (a Postgres restart) is noticed for free instead: asyncpg marks it closed
    as soon as the event loop sees the socket close, and the checkout below swaps it for a fresh one. A connection
    that dies while checked out fails its statement, SQLAlchemy then recycles every connection older than it, and the
    engine (`errors.Unavailable`) or the API (503) handles that one failure.
    """
    engine = create_async_engine(
        url, pool_size=pool_size, max_overflow=pool_size if max_overflow is None else max_overflow
    )
    event.listen(engine.sync_engine, "checkout", _closed_is_disconnected)
    return engine


def worker_pool(worker_concurrency: int) -> tuple[int, int]:
    """Pool size and overflow for a worker: one connection per running execution at most (none holds two), plus
    the claim loop and the timers; half of it kept open, the rest opened under load."""
    needed = worker_concurrency + 4
    kept = min(needed, max(10, needed // 2))
    return kept, needed - kept


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


def _alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _upgrade(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
    command.upgrade(_alembic_config(connection), "head")


async def migrate(engine: AsyncEngine) -> None:
    """Upgrade the database to the latest migration."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)


def _is_current(connection: Connection) -> bool:
    heads = set(ScriptDirectory.from_config(_alembic_config()).get_heads())
    return set(MigrationContext.configure(connection).get_current_heads()) == heads


async def is_current(engine: AsyncEngine) -> bool:
    """Whether the database answers and is at the latest migration."""
    async with engine.connect() as conn:
        return await conn.run_sync(_is_current)


@contextmanager
def embedded_postgres(settings: Settings) -> Iterator[str]:
    """Start (or join) a real PostgreSQL from the `pgserver` wheel under `DATA_DIR`; yield its URL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgserver's platformdirs warns about XDG_RUNTIME_DIR
        import pgserver

        data = (settings.data_dir / "pg").resolve()
        data.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", data)
        server: Any = pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        yield f"postgresql+asyncpg://postgres@/postgres?host={data}"
    finally:
        log.info("stopping embedded PostgreSQL")
        server.cleanup()
