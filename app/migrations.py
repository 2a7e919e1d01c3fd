"""The database schema's migrations (the Alembic scripts in `migrations/`): upgrading, and whether it is current."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

SCRIPTS = Path(__file__).resolve().parent.parent / "migrations"
LOCK = 7_316_001  # pg_advisory_xact_lock key: replicas never migrate at once


async def upgrade(engine: AsyncEngine) -> None:
    """Upgrade the database to the latest migration."""
    async with engine.begin() as conn:
        await conn.run_sync(_upgrade)


async def is_current(engine: AsyncEngine) -> bool:
    """Whether the database answers and is at the latest migration."""
    async with engine.connect() as conn:
        return await conn.run_sync(_is_current)


def _config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _upgrade(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK})
    command.upgrade(_config(connection), "head")


def _is_current(connection: Connection) -> bool:
    heads = set(ScriptDirectory.from_config(_config()).get_heads())
    return set(MigrationContext.configure(connection).get_current_heads()) == heads
