"""Variable values at thread, user and instance scope (one table; secrets encrypted with the server key)."""

from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

from cryptography.fernet import Fernet
from sqlalchemy import delete, func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import crypto, db, errors, queue, tables

INSTANCE = ""  # the owner of instance-scoped values
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Value:
    """A resolved value; `secret` ones are never shown."""

    value: str
    type: str


@dataclass(frozen=True)
class Layers:
    """The stored values a thread resolves, highest first (secrets decrypted: for the engine only)."""

    thread: dict[str, Value]
    user: dict[str, Value]
    instance: dict[str, Value]


def check(name: str, value: str) -> None:
    """Refuse a name that is not an identifier, or a value Postgres cannot store."""
    if not NAME.fullmatch(name):
        raise errors.Invalid(f"`{name[:200]}` is not a variable name: use letters, digits and `_`, not a digit first")
    if "\x00" in value:
        raise errors.Invalid(f"the value of `{name}` contains a NUL character")


async def put(
    session: AsyncSession, fernet: Fernet, scope: str, owner: str, values: dict[str, str], secret: set[str]
) -> None:
    """Upsert values of one scope; names in `secret` are encrypted."""
    for name, value in values.items():
        kind = "secret" if name in secret else "text"
        stored = crypto.encrypt(fernet, value) if kind == "secret" else value
        stmt = insert(tables.EnvValue).values(scope=scope, owner=owner, name=name, type=kind, value=stored)
        await session.execute(
            stmt.on_conflict_do_update(
                constraint="env_values_scope_owner_name", set_={"type": kind, "value": stored, "updated_at": func.now()}
            )
        )


async def remove(session: AsyncSession, scope: str, owner: str, names: list[str]) -> int:
    """Delete values of one scope; returns how many there were."""
    result = await session.execute(
        delete(tables.EnvValue).where(
            tables.EnvValue.scope == scope, tables.EnvValue.owner == owner, tables.EnvValue.name.in_(names)
        )
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def public(session: AsyncSession, scope: str, owner: str) -> tuple[dict[str, str | None], dict[str, str]]:
    """(`env`, `env_types`) of one scope as the API shows them: secret values are null."""
    rows = (
        await session.execute(
            select(tables.EnvValue)
            .where(tables.EnvValue.scope == scope, tables.EnvValue.owner == owner)
            .order_by(tables.EnvValue.name)
        )
    ).scalars()
    env: dict[str, str | None] = {}
    types: dict[str, str] = {}
    for r in rows:
        env[r.name] = None if r.type == "secret" else r.value
        types[r.name] = r.type
    return env, types


async def names(session: AsyncSession, user_id: str) -> set[str]:
    """Names the user's and the instance's values define (what a new thread of the user inherits)."""
    rows = await session.execute(
        select(tables.EnvValue.name).where(
            or_(
                (tables.EnvValue.scope == "user") & (tables.EnvValue.owner == user_id),
                (tables.EnvValue.scope == "instance") & (tables.EnvValue.owner == INSTANCE),
            )
        )
    )
    return set(rows.scalars())


_LAYERS = (
    "SELECT scope, name, type, value FROM env_values"
    " WHERE (scope = 'thread' AND owner = $1) OR (scope = 'user' AND owner = $2) OR (scope = 'instance' AND owner = $3)"
)


async def layers(session: AsyncSession, fernet: Fernet, thread_id: uuid.UUID, user_id: str) -> Layers:
    """The thread's, its owner's and the instance's values in one query, secrets decrypted (for the engine only:
    every step asks). In a transaction that read the values' version (`queue.waiting`: `counters.env`, moved on by
    the commit of any write to them), the layers last read at that version are reused instead."""
    version: int | None = session.info.get(queue.ENV_VERSION)
    key = (thread_id, user_id)
    kept = _KEPT.get(key)
    if version is not None and kept is not None and kept[0] == version:
        _KEPT.move_to_end(key)
        return _copy(kept[1])
    rows = await (await db.driver(session)).fetch(_LAYERS, str(thread_id), user_id, INSTANCE)
    found = Layers({}, {}, {})
    for r in rows:
        value = Value(crypto.decrypt(fernet, r["value"]) if r["type"] == "secret" else r["value"], r["type"])
        getattr(found, r["scope"])[r["name"]] = value
    if version is not None:  # read after the version: at least as new as it (a newer write bumps it past)
        _KEPT[key] = (version, _copy(found))
        _KEPT.move_to_end(key)
        while len(_KEPT) > KEPT:
            _KEPT.popitem(last=False)
    return found


KEPT = 10_000  # threads whose layers a worker keeps (the least recently used go)
_KEPT: OrderedDict[tuple[uuid.UUID, str], tuple[int, Layers]] = OrderedDict()


def _copy(layers: Layers) -> Layers:
    """Layers of their own (a tool setting a value changes its step's copy)."""
    return Layers(dict(layers.thread), dict(layers.user), dict(layers.instance))


async def set_thread(
    session: AsyncSession, fernet: Fernet, thread_id: uuid.UUID, values: dict[str, str], secret: set[str]
) -> None:
    """Upsert thread-scoped values; names in `secret` are encrypted."""
    await put(session, fernet, "thread", str(thread_id), values, secret)


async def delete_thread(session: AsyncSession, thread_id: uuid.UUID, names: list[str]) -> None:
    await remove(session, "thread", str(thread_id), names)


async def thread_types(session: AsyncSession, thread_id: uuid.UUID) -> dict[str, str]:
    """Names and types of the thread's values (what the API may show about secrets)."""
    rows = await session.execute(
        select(tables.EnvValue.name, tables.EnvValue.type).where(
            tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id)
        )
    )
    return {r.name: r.type for r in rows}


async def public_view(session: AsyncSession, thread_id: uuid.UUID) -> tuple[dict[str, str | None], dict[str, str]]:
    """(`env`, `env_types`) as the API shows them: secret values are null."""
    return await public(session, "thread", str(thread_id))


# COPY: a parent's thread values (still encrypted) into a new child, in one statement, leaving out the names in $3
# and, for the names in $4, the name and every `NAME__k` (an immediate fan-out's per-instance values).
_COPY = """
INSERT INTO env_values (scope, owner, name, type, value)
SELECT 'thread', $2, name, type, value FROM env_values
WHERE scope = 'thread' AND owner = $1
    AND NOT name = ANY($3::text[]) AND NOT regexp_replace(name, '__[0-9]+$', '') = ANY($4::text[])
"""


async def copy_thread(
    session: AsyncSession,
    source: uuid.UUID,
    destination: uuid.UUID,
    exclude: Collection[str],
    instances: Collection[str] = (),
) -> None:
    """Give a child a copy of its parent's thread values, leaving out `exclude` (scoped names) and, for the names
    in `instances`, the name and every `NAME__k` (§6.6, §6.7)."""
    await (await db.driver(session)).execute(_COPY, str(source), str(destination), list(exclude), list(instances))


async def delete_all(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Every value of a thread (it is being deleted)."""
    await session.execute(
        delete(tables.EnvValue).where(tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id))
    )
