"""Variable requests (§6.7): a child creation that waits for scoped values the caller must provide
(`GET/POST /threads/{id}/variables/{request_id}`), then starts the child from the stored payload."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from enum import StrEnum

from cryptography.fernet import Fernet
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app import children, environment, errors, tables
from app.catalog import Catalog


class Status(StrEnum):
    """A variable request's `status` (`variable_requests.status`)."""

    PENDING = "pending"  # waits for the caller to provide the missing values
    SUCCESS = "success"  # fulfilled: the child started (`child_id`); a request is used once


async def create(
    session: AsyncSession,
    fernet: Fernet,
    parent: tables.Thread,
    agent: str,
    required: list[str],
    missing: list[str],
    creation: children.Creation,
) -> tables.VariableRequest:
    """Store a creation that waits for scoped values (§6.7)."""
    row = tables.VariableRequest(
        id=uuid.uuid4(),
        parent_id=parent.id,
        agent=agent,
        required=required,
        missing=missing,
        payload=creation.payload(fernet),
    )
    session.add(row)
    await session.flush()
    return row


async def tags(session: AsyncSession, parent_id: uuid.UUID) -> set[str]:
    """Tags of the immediate instances the parent's variable requests stand for (they are not started twice)."""
    rows = await session.execute(
        select(tables.VariableRequest.payload).where(tables.VariableRequest.parent_id == parent_id)
    )
    return {tag for payload in rows.scalars() for tag in payload.get("tags") or []}


async def get(session: AsyncSession, parent_id: uuid.UUID, request_id: uuid.UUID) -> tables.VariableRequest:
    row = await session.get(tables.VariableRequest, request_id, with_for_update={"key_share": True})
    if row is None or row.parent_id != parent_id:
        raise errors.VariableRequestNotFound(f"Variable request {request_id} not found")
    return row


async def fulfil(
    session: AsyncSession,
    catalog: Catalog,
    fernet: Fernet,
    parent: tables.Thread,
    request: tables.VariableRequest,
    values: dict[str, str],
    most: int | None = None,
) -> tables.Thread:
    """Create the deferred child from the request's original payload with `values` as its scoped env (the child
    holding at most `most` values); the child reports like a non-blocking one. `MissingVariables` (what is still
    missing), or `Conflict` when used twice."""
    if request.status != Status.PENDING:
        raise errors.RequestUsed("This variable request was already used")
    if parent.terminated_at is not None:
        raise errors.ThreadTerminated()
    creation = children.Creation.of(request.payload, fernet)
    provided = {**creation.scoped_env, **values}  # an immediate instance's own values count too
    _, missing = await children.missing_scoped(session, catalog, fernet, parent, request.agent, provided)
    if missing:
        raise environment.missing(missing, errors.StillMissing)
    scoped_env = {**creation.scoped_env, **values}
    deferred = replace(creation, blocking=False, scoped_env=scoped_env)
    child = await children.start(session, catalog, fernet, parent, deferred, most=most)
    request.status = Status.SUCCESS
    request.child_id = child.id
    request.missing = []
    request.updated_at = datetime.now(UTC)
    return child
