"""Database engine and sessions, migrations, and the embedded Postgres for a fresh machine."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.settings import Settings

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
MIGRATION_LOCK = 7_316_001  # pg_advisory_xact_lock key: replicas never migrate at once


def create_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    """An asyncpg engine; JSONB values go through the standard json module."""
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded values after commit (the edge commits, then reads)."""
    return async_sessionmaker(engine, expire_on_commit=False)


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
