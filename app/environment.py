"""Variable values at thread, user and instance scope (one table; secrets encrypted with the server key)."""

from __future__ import annotations

import re
import uuid
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet
from sqlalchemy import delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app import crypto, db, errors, queue, statements, tables

if TYPE_CHECKING:  # the catalog holds the graph; this module only reads it
    from app.catalog import Catalog

INSTANCE = ""  # the owner of instance-scoped values
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NAME_CHARS = 128  # a name is an identifier, not data (the column holds 200)


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


@dataclass(frozen=True)
class Limits:
    """How much env one owner (a thread, a user, the instance) may hold: `ENV_MAX_VARIABLES` values of at most
    `ENV_MAX_VALUE_BYTES` each."""

    variables: int
    value_bytes: int


def check_name(name: str) -> None:
    """The one rule for a variable name, wherever one enters: an identifier of at most `NAME_CHARS` characters."""
    if len(name) > NAME_CHARS or not NAME.fullmatch(name):
        shown = name if len(name) <= 40 else name[:40] + "…"
        raise errors.BadVariableName(
            f"`{shown}` is not a variable name: use 1 to {NAME_CHARS} letters, digits and `_`, not a digit first"
        )


def check(values: Mapping[str, str], limits: Limits) -> None:
    """Refuse values no request may write: more than an owner may hold, a bad name, a value over the size limit or
    one Postgres cannot store."""
    if len(values) > limits.variables:
        raise _too_many(len(values), limits.variables)
    for name, value in values.items():
        check_name(name)
        size = len(value.encode())
        if size > limits.value_bytes:
            raise errors.VariableTooLarge(
                f"The value of `{name}` is {size} bytes; a value may have at most {limits.value_bytes} bytes "
                "(`ENV_MAX_VALUE_BYTES`).",
                name=name,
                limit=limits.value_bytes,
                bytes=size,
            )
        if db.has_nul(value):
            raise errors.Invalid(f"the value of `{name}`: {db.NUL_REFUSED}")


async def unresolved(
    session: AsyncSession,
    fernet: Fernet,
    catalog: Catalog,
    agent: str,
    user_id: str,
    provided: Mapping[str, str],
    *,
    scoped: bool,
    inherited: Mapping[str, str] | None = None,
) -> list[str]:
    """Required variables of the agent's graph (the scoped ones, or the others) that neither `provided`, the user's
    and the instance's values nor the definitions' `env` define (`Catalog.unresolved`, §8). Its `optional` branches
    are on or off by the values the new thread will resolve: `provided`, then `inherited` (what a child copies from
    its parent's thread env, which satisfies no scoped variable), then the user's and the instance's (§6.6)."""
    shared = await shared_values(session, fernet, user_id)
    values = {**shared, **(inherited or {}), **provided}
    return catalog.unresolved(agent, set(provided) | set(shared), scoped=scoped, values=values)


def missing(
    variables: list[str], error: type[errors.MissingVariables] = errors.MissingVariables
) -> errors.MissingVariables:
    """The error naming required variables nothing defines (`StillMissing` when a variable request lacks them)."""
    return error(f"Missing required variables: {', '.join(variables)}", missing=variables)


def _too_many(count: int, limit: int) -> errors.TooManyVariables:
    return errors.TooManyVariables(
        f"That would make {count} variables; a thread, a user or the instance may hold at most {limit} variables "
        "(`ENV_MAX_VARIABLES`).",
        limit=limit,
        count=count,
    )


# PUT: upsert an owner's values ($3 names, $4 types, $5 values) in one statement. With a bound ($6), nothing is
# written unless the owner then holds at most that many. Returns how many it holds (or would hold) after.
_PUT = """
WITH held AS (
    SELECT count(*) + cardinality($3::text[]) AS n FROM env_values
    WHERE scope = $1 AND owner = $2 AND NOT name = ANY($3::text[])
), written AS (
    INSERT INTO env_values (scope, owner, name, type, value)
    SELECT $1, $2, v.name, v.type, v.value FROM unnest($3::text[], $4::text[], $5::text[]) AS v(name, type, value)
    WHERE $6::int IS NULL OR (SELECT n FROM held) <= $6::int
    ON CONFLICT ON CONSTRAINT env_values_scope_owner_name
    DO UPDATE SET type = excluded.type, value = excluded.value, updated_at = now()
)
SELECT n FROM held
"""


async def put(
    session: AsyncSession,
    fernet: Fernet,
    scope: str,
    owner: str,
    values: Mapping[str, str],
    secret: Collection[str],
    *,
    most: int | None = None,
) -> None:
    """Upsert values of one scope (names and values `check`ed) in one statement; names in `secret` are encrypted.
    With `most`, a write that would leave the owner more values than that is refused and writes nothing."""
    if not values:
        return
    names = list(values)
    kinds = ["secret" if name in secret else "text" for name in names]
    stored = [
        crypto.encrypt(fernet, values[n]) if k == "secret" else values[n] for n, k in zip(names, kinds, strict=True)
    ]
    held = await (await statements.driver(session)).fetchval(_PUT, scope, owner, names, kinds, stored, most)
    if most is not None and held > most:
        raise _too_many(held, most)


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
    t = tables.EnvValue
    rows = await session.execute(
        select(t.name, t.type, t.value).where(t.scope == scope, t.owner == owner).order_by(t.name)
    )
    env: dict[str, str | None] = {}
    types: dict[str, str] = {}
    for r in rows:
        env[r.name] = None if r.type == "secret" else r.value
        types[r.name] = r.type
    return env, types


async def shared_values(session: AsyncSession, fernet: Fernet, user_id: str) -> dict[str, str]:
    """The user's and the instance's values (the user's win), secrets decrypted: what a new thread of the user
    inherits."""
    rows = await session.execute(
        select(tables.EnvValue.scope, tables.EnvValue.name, tables.EnvValue.type, tables.EnvValue.value).where(
            or_(
                (tables.EnvValue.scope == "user") & (tables.EnvValue.owner == user_id),
                (tables.EnvValue.scope == "instance") & (tables.EnvValue.owner == INSTANCE),
            )
        )
    )
    found: dict[str, str] = {}
    for r in sorted(rows, key=lambda r: r.scope == "user"):  # the instance's first, so the user's overwrite them
        found[r.name] = crypto.decrypt(fernet, r.value) if r.type == "secret" else r.value
    return found


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
    rows = await (await statements.driver(session)).fetch(_LAYERS, str(thread_id), user_id, INSTANCE)
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
    session: AsyncSession,
    fernet: Fernet,
    thread_id: uuid.UUID,
    values: Mapping[str, str],
    secret: Collection[str],
    *,
    most: int | None = None,
) -> None:
    """Upsert thread-scoped values (`put`); names in `secret` are encrypted."""
    await put(session, fernet, "thread", str(thread_id), values, secret, most=most)


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


async def types_by_thread(session: AsyncSession, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, str]]:
    """Names and types of several threads' values, by thread, in one query (listings show no values)."""
    t = tables.EnvValue
    owners = [str(i) for i in ids]
    rows = await session.execute(
        select(t.owner, t.name, t.type).where(t.scope == "thread", t.owner.in_(owners)).order_by(t.owner, t.name)
    )
    found: dict[uuid.UUID, dict[str, str]] = {}
    for r in rows:
        found.setdefault(uuid.UUID(r.owner), {})[r.name] = r.type
    return found


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
    await (await statements.driver(session)).execute(
        _COPY, str(source), str(destination), list(exclude), list(instances)
    )


# PROPAGATE: a thread's value of $2 (as it is stored, still encrypted) into every live descendant ($1 the thread's
# id), in one statement; a descendant running an agent of $3 (one that declares $2 scoped) is left out with its
# subtree (§8).
_PROPAGATE = """
WITH RECURSIVE below AS (
    SELECT id FROM threads WHERE parent_id = $1::uuid AND terminated_at IS NULL AND NOT agent = ANY($3::text[])
    UNION ALL
    SELECT t.id FROM threads t JOIN below b ON t.parent_id = b.id
    WHERE t.terminated_at IS NULL AND NOT t.agent = ANY($3::text[])
)
INSERT INTO env_values (scope, owner, name, type, value)
SELECT 'thread', below.id::text, v.name, v.type, v.value FROM below, env_values v
WHERE v.scope = 'thread' AND v.owner = $1::text AND v.name = $2
ON CONFLICT ON CONSTRAINT env_values_scope_owner_name
DO UPDATE SET type = excluded.type, value = excluded.value, updated_at = now()
"""


async def propagate(session: AsyncSession, thread_id: uuid.UUID, name: str, scoped_in: Collection[str]) -> None:
    """Copy the thread's value of `name` to its live (not terminated) descendants, except into the subtrees of
    children running an agent in `scoped_in` (their graph declares `name` scoped) (§8)."""
    await (await statements.driver(session)).execute(_PROPAGATE, str(thread_id), name, list(scoped_in))


async def delete_all(session: AsyncSession, thread_id: uuid.UUID) -> None:
    """Every value of a thread (it is being deleted)."""
    await session.execute(
        delete(tables.EnvValue).where(tables.EnvValue.scope == "thread", tables.EnvValue.owner == str(thread_id))
    )
