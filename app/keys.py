"""API keys: created by the CLI, stored as SHA-256, each belonging to a user (admins see every thread)."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app import db, errors, tables

PREFIX = "sa_"


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
    row = tables.ApiKey(id=uuid.uuid4(), user_id=user_id, key_hash=_hash(key), prefix=key[:10], admin=admin)
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
    return int(await (await db.driver(session)).fetchval("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL"))


async def list_all(session: AsyncSession) -> list[tables.ApiKey]:
    return list((await session.execute(select(tables.ApiKey).order_by(tables.ApiKey.created_at))).scalars())


async def revoke(session: AsyncSession, key_id_or_prefix: str) -> int:
    """Revoke keys by id or by their printed prefix; returns how many."""
    cond = tables.ApiKey.prefix == key_id_or_prefix
    with contextlib.suppress(ValueError):
        cond = cond | (tables.ApiKey.id == uuid.UUID(key_id_or_prefix))
    result = await session.execute(
        update(tables.ApiKey).where(cond, tables.ApiKey.revoked_at.is_(None)).values(revoked_at=func.now())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
