"""API keys: created by the CLI, stored as SHA-256, each belonging to a user (admins see every thread)."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, statements, tables

PREFIX = "sa_"
SHOWN = 10  # characters of a key stored and shown (`sa_` and 7 more): enough to tell keys apart, never to use one
BOOTSTRAP_USER = "admin"  # the user `ADMIN_API_KEY`'s key belongs to


@dataclass(frozen=True)
class Principal:
    """Who is calling."""

    user_id: str
    admin: bool = False
    key_id: uuid.UUID | None = None  # the key presented (none in open mode): its streams end when it is revoked


OPEN = Principal(user_id="local", admin=True)  # the caller in open mode (loopback bind, no key configured)


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def create(session: AsyncSession, user_id: str, admin: bool = False) -> tuple[tables.ApiKey, str]:
    """Make a key; the plain key is returned once and never stored."""
    if not user_id.strip():
        raise errors.Invalid("a key needs a user id")
    key = PREFIX + secrets.token_urlsafe(32)
    row = tables.ApiKey(id=uuid.uuid4(), user_id=user_id, key_hash=_hash(key), prefix=key[:SHOWN], admin=admin)
    session.add(row)
    await session.flush()
    return row, key


async def verify(session: AsyncSession, key: str) -> Principal:
    """The principal a presented key belongs to, or `Unauthorized`."""
    row = (
        await session.execute(
            select(tables.ApiKey).where(tables.ApiKey.key_hash == _hash(key), tables.ApiKey.revoked_at.is_(None))
        )
    ).scalar_one_or_none()
    if row is None:
        raise errors.Unauthorized("The API key is not valid.")
    return Principal(user_id=row.user_id, admin=row.admin, key_id=row.id)


async def revoked(session: AsyncSession, ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Which of `ids` no longer let anyone in: revoked, or gone."""
    active = select(tables.ApiKey.id).where(tables.ApiKey.id.in_(ids), tables.ApiKey.revoked_at.is_(None))
    return set(ids) - set((await session.execute(active)).scalars())


CHANNEL = "agents_keys"  # notified by a trigger on any change to `api_keys` (migration 0012)


class Keyless:
    """Open mode's question at each request, "is there still no key?", counted once per change: the answer is kept
    while the connection that hears of changes (the hub's, listening on `CHANNEL`) stays up. A key created ends
    open mode as soon as its notification arrives (moments after its commit)."""

    def __init__(self) -> None:
        self._epoch = 0  # moves on at every notification, and whenever the listener (re)connects
        self._none_at: int | None = None  # the epoch at which a count found no key

    def changed(self) -> None:
        self._epoch += 1

    async def none(self, session: AsyncSession, *, listening: bool) -> bool:
        if listening and self._none_at == self._epoch:
            return True
        epoch = self._epoch  # a change heard during the count moves it on: the next request counts again
        none = await active_count(session) == 0
        self._none_at = epoch if none and listening else None
        return none


async def active_count(session: AsyncSession) -> int:
    """Keys not revoked (open mode ends with the first), in plain SQL."""
    return int(
        await (await statements.driver(session)).fetchval("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL")
    )


async def list_all(session: AsyncSession) -> list[tables.ApiKey]:
    return list((await session.execute(select(tables.ApiKey).order_by(tables.ApiKey.created_at))).scalars())


async def bootstrap(session: AsyncSession, key: str) -> tuple[tables.ApiKey, bool]:
    """Store the operator's chosen admin key (`ADMIN_API_KEY`) unless it is stored already, revoked or not, and say
    whether it was stored now: running this at every start-up is harmless, and a key once revoked stays revoked."""
    stored = await session.execute(
        insert(tables.ApiKey)
        .values(id=uuid.uuid4(), user_id=BOOTSTRAP_USER, key_hash=_hash(key), prefix=key[:SHOWN], admin=True)
        .on_conflict_do_nothing(index_elements=[tables.ApiKey.key_hash])
        .returning(tables.ApiKey.id)
    )
    created = stored.scalar_one_or_none() is not None
    row = (await session.execute(select(tables.ApiKey).where(tables.ApiKey.key_hash == _hash(key)))).scalar_one()
    return row, created


async def revoke(session: AsyncSession, ref: str) -> int:
    """Revoke the one active key `ref` names: its id, the prefix `agents keys list` shows (with or without the `…`)
    or the key itself; returns how many were revoked (0 or 1). A prefix two active keys share is refused."""
    ref = ref.strip().removesuffix("…").removesuffix("...")
    t = tables.ApiKey
    cond = (t.prefix == ref) | (t.key_hash == _hash(ref))
    with contextlib.suppress(ValueError):
        cond = cond | (t.id == uuid.UUID(ref))
    found = list(
        (await session.execute(select(t).where(cond, t.revoked_at.is_(None)).order_by(t.created_at))).scalars()
    )
    if len(found) > 1:
        ids = ", ".join(str(row.id) for row in found)
        raise errors.Conflict(f"{len(found)} active keys start with {ref}: revoke one by its id ({ids})")
    if not found:
        return 0
    await session.execute(update(t).where(t.id == found[0].id).values(revoked_at=func.now()))
    return 1


async def open_threads(session: AsyncSession) -> int:
    """Top-level threads made in open mode (they belong to `OPEN`'s user, whom no key is for)."""
    t = tables.Thread
    query = select(func.count()).select_from(t).where(t.user_id == OPEN.user_id, t.parent_id.is_(None))
    return int((await session.execute(query)).scalar_one())


@dataclass(frozen=True)
class Adopted:
    """What `adopt_open` moved to its user, and the user variables it left (the user had their own of that name)."""

    threads: int
    variables: int
    kept: list[str]


async def adopt_open(session: AsyncSession, user_id: str) -> Adopted:
    """Give everything open mode made to `user_id`: its threads (their messages, files, thread variables and
    subagents follow their thread), their lifecycle events, and the user variables of `OPEN`'s user."""
    if not user_id.strip() or user_id == OPEN.user_id:
        raise errors.Invalid(f"open mode's threads need another owner than {OPEN.user_id!r}")
    threads = await open_threads(session)
    t, v = tables.Thread, tables.EnvValue
    await session.execute(update(t).where(t.user_id == OPEN.user_id).values(user_id=user_id))
    e = tables.LifecycleEvent
    await session.execute(update(e).where(e.user_id == OPEN.user_id).values(user_id=user_id))
    theirs = select(v.name).where(v.scope == "user", v.owner == user_id)
    mine = (v.scope == "user") & (v.owner == OPEN.user_id)
    result = await session.execute(update(v).where(mine, v.name.not_in(theirs)).values(owner=user_id))
    kept = list((await session.execute(select(v.name).where(mine).order_by(v.name))).scalars())
    return Adopted(threads, int(result.rowcount), kept)  # type: ignore[attr-defined]
