"""Alembic environment: runs on the connection `app.migrations.upgrade` hands over, or on `DATABASE_URL`."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection

from app import db, migrations
from app.settings import Settings
from app.tables import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()
        migrations.record(connection)  # which releases run on the schema now: read by older ones


async def _run_from_url(url: str) -> None:
    engine = db.create_engine(url, 1)  # the one translation of DATABASE_URL's query (sslmode, …)
    async with engine.begin() as conn:
        await conn.run_sync(_run)
    await engine.dispose()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = Settings().database_url
    if not url:
        raise SystemExit("set DATABASE_URL, or use `agents migrate`, which starts the embedded Postgres")
    asyncio.run(_run_from_url(url))
