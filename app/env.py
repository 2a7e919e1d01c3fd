"""Variable values at thread scope (user and instance scopes share the table)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from cryptography.fernet import Fernet
from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import crypto, tables


@dataclass(frozen=True)
class Value:
    """A resolved value; `secret` ones are never shown."""

    value: str
    type: str


async def set_thread(
    session: AsyncSession, fernet: Fernet, thread_id: uuid.UUID, values: dict[str, str], secret: set[str]
) -> None:
    """Upsert thread-scoped values; names in `secret` are encrypted."""
    for name, value in values.items():
        kind = "secret" if name in secret else "text"
        stored = crypto.encrypt(fernet, value) if kind == "secret" else value
        stmt = insert(tables.EnvValue).values(scope="thread", owner=str(thread_id), name=name, type=kind, value=stored)
        await session.execute(
            stmt.on_conflict_do_update(constraint="env_values_scope_owner_name", set_={"type": kind, "value": stored})
        )


async def delete_thread(session: AsyncSession, thread_id: uuid.UUID, names: list[str]) -> None:
    await session.execute(
        delete(tables.EnvValue).where(
            tables.EnvValue.scope == "thread",
            tables.EnvValue.owner == str(thread_id),
            tables.EnvValue.name.in_(names),
        )
    )


async def thread_types(session: AsyncSession, thread_id: uuid.UUID) -> dict[str, str]:
    """Names and types of the thread's values (what the API may show about secrets)."""
    rows = await session.execute(
        select(tables.EnvValue.name, tables.EnvValue.type).where(
            tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id)
        )
    )
    return {r.name: r.type for r in rows}


async def thread_values(session: AsyncSession, fernet: Fernet, thread_id: uuid.UUID) -> dict[str, Value]:
    """The thread's values, secrets decrypted (for the engine only)."""
    rows = (
        await session.execute(
            select(tables.EnvValue).where(tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id))
        )
    ).scalars()
    return {r.name: Value(crypto.decrypt(fernet, r.value) if r.type == "secret" else r.value, r.type) for r in rows}


async def public_view(session: AsyncSession, thread_id: uuid.UUID) -> tuple[dict[str, str | None], dict[str, str]]:
    """(`env`, `env_types`) as the API shows them: secret values are null."""
    rows = (
        await session.execute(
            select(tables.EnvValue).where(tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id))
        )
    ).scalars()
    env: dict[str, str | None] = {}
    types: dict[str, str] = {}
    for r in rows:
        env[r.name] = None if r.type == "secret" else r.value
        types[r.name] = r.type
    return env, types


async def delete_all(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Every value of a thread (it is being deleted)."""
    await session.execute(
        delete(tables.EnvValue).where(tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id))
    )
