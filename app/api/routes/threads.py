"""Threads: create, list, read, stop, continue, terminate."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from sqlalchemy.ext.asyncio import AsyncSession

from app import attachments, control, environment, errors, events, inputs, messages, queue, tables, threads
from app.api import bodies, schemas
from app.api.deps import CatalogDep, CurrentUser, EnvLimits, FernetDep, SessionDep, SettingsDep
from app.event_types import LifecycleEvent

router = APIRouter(tags=["threads"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}
TAG_FILTER_CHARS = 1000  # `?tag=`: tags the runtime sets (`name:<subagent name>`) are not bounded as a client's are


async def view(session: AsyncSession, row: tables.Thread, children: int | None = None) -> schemas.Thread:
    """The API's `Thread` for a row, with its env (text values shown, secret ones null)."""
    values, types = await environment.public_view(session, row.id)
    if children is None:
        children = (await threads.children_counts(session, [row.id])).get(row.id, 0)
    return _thread(row, children, values, types)


async def _announced(
    session: AsyncSession, row: tables.Thread, type_: LifecycleEvent, children: int | None = None
) -> schemas.Thread:
    """The thread's view, its lifecycle event, and the commit: the event last, since it locks the lifecycle log's one
    counter row until the commit (every thread created, changed or deleted takes that lock in turn)."""
    result = await view(session, row, children)
    await events.append_lifecycle(session, row, type_)
    await session.commit()
    return result


def _thread(
    row: tables.Thread, children: int, values: dict[str, str | None] | None, types: dict[str, str]
) -> schemas.Thread:
    return schemas.Thread(
        id=row.id,
        agent=row.agent,
        origin_agent=row.origin_agent,
        type=row.type,
        parent_id=row.parent_id,
        user_id=row.user_id,
        name=row.name,
        tags=row.tags,
        status=row.status,
        side=row.side,
        session=schemas.Session(
            number=row.session_number,
            turns=row.session_turns,
            status=row.session_status,
            reason=row.session_reason,
            result=row.session_result,
            status_text=row.status_text,
        ),
        env=values,
        env_types=types,
        created_at=row.created_at,
        updated_at=row.updated_at,
        last_message_at=row.last_message_at,
        terminated_at=row.terminated_at,
        children_count=children,
    )


@router.post(
    "/threads",
    operation_id="createThread",
    status_code=201,
    responses={**ERRORS, 413: {"model": schemas.Error}, 422: {"model": schemas.Error}},
)
async def create_thread(
    body: schemas.ThreadIn,
    session: SessionDep,
    who: CurrentUser,
    catalog: CatalogDep,
    settings: SettingsDep,
    fernet: FernetDep,
    limits: EnvLimits,
) -> schemas.Thread:
    """Create a thread of an agent; `messages` are queued in order. 413 past the env limits."""
    agent = catalog.agent(body.agent)
    environment.check(body.env, limits)
    unknown_secrets = sorted(set(body.secrets) - set(body.env))
    if unknown_secrets:
        raise errors.Invalid(f"`secrets` names variables not in `env`: {', '.join(unknown_secrets)}")
    # required, non-scoped variables of the agent's graph that nothing defines where they are read (§8)
    missing = await environment.unresolved(session, fernet, catalog, agent.name, who.user_id, body.env, scoped=False)
    if missing:
        raise environment.missing(missing)
    row = await threads.create(session, agent, who, name=body.name, tags=body.tags)
    await environment.set_thread(
        session, fernet, row.id, body.env, set(body.secrets) | catalog.secret_names(agent.name)
    )
    if any(e.immediate for e in catalog.prompts[agent.side_a.prompt].tool_entries()):
        await queue.enqueue(session, row.id, inputs.Kind.SPAWN, {})  # immediate subagents start at once (§6.6)
    limit = settings.max_file_bytes
    for message in body.messages:  # as `POST /messages` queues them: attachments stored under `/attachments/`
        refs = await attachments.store_encoded(session, row.id, message.attachments, limit)
        await messages.enqueue(
            session,
            row,
            message.role,
            message.content,
            silent=message.silent,
            metadata=message.metadata,
            attachments=refs,
            posted=True,
        )
    return await _announced(session, row, "thread_created", 0)


@router.get("/threads", operation_id="listThreads", responses={401: {"model": schemas.Error}})
async def list_threads(
    session: SessionDep,
    who: CurrentUser,
    agent: Annotated[str | None, Query(max_length=schemas.AGENT_CHARS)] = None,
    tag: Annotated[
        str | None, Query(max_length=TAG_FILTER_CHARS, description="a tag; the runtime's own may be longer")
    ] = None,
    parent_id: Annotated[
        uuid.UUID | Literal["none"] | None, Query(description="a thread id, or `none` for top-level threads")
    ] = None,
    status: Literal["idle", "queued", "running", "waiting", "stopped", "terminated"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: schemas.Cursor = None,
) -> schemas.ThreadList:
    """The caller's threads, newest first; each shows its env's names and types, not its values (`env` is null)."""
    rows, next_cursor = await threads.list_(
        session, who, agent=agent, tag=tag, parent_id=parent_id, status=status, limit=limit, cursor=cursor
    )
    ids = [r.id for r in rows]
    counts = await threads.children_counts(session, ids)
    types = await environment.types_by_thread(session, ids)
    listed = [_thread(r, counts.get(r.id, 0), None, types.get(r.id, {})) for r in rows]
    return schemas.ThreadList(threads=listed, next_cursor=next_cursor)


@router.get("/threads/{thread_id}", operation_id="getThread", responses=ERRORS)
async def get_thread(thread_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.Thread:
    """One thread."""
    return await view(session, await threads.get(session, thread_id, who))


@router.post(
    "/threads/{thread_id}/stop", operation_id="stopThread", responses={**ERRORS, 409: {"model": schemas.Error}}
)
async def stop_thread(thread_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.Thread:
    """Abort the running step, answer its open tool calls, and park the thread (§11)."""
    thread = await threads.get(session, thread_id, who, lock=True)
    await control.stop(session, thread)
    return await _announced(session, thread, "thread_updated")


@router.post(
    "/threads/{thread_id}/continue",
    operation_id="continueThread",
    status_code=202,
    responses={**ERRORS, 409: {"model": schemas.Error}, 422: {"model": schemas.Error}},
)
async def continue_thread(
    thread_id: uuid.UUID,
    session: SessionDep,
    who: CurrentUser,
    catalog: CatalogDep,
    body: schemas.ContinueIn | None = None,
) -> schemas.Thread:
    """Clear a stop and make a side act (default `a`)."""
    side = (body or schemas.ContinueIn()).side
    thread = await threads.get(session, thread_id, who, lock=True)
    if catalog.agent(thread.agent).side(side) is None:
        raise errors.NoSuchSide(f"Agent `{thread.agent}` has no side `{side}` that could act; use side `a`.")
    await control.resume(session, thread, side)
    return await _announced(session, thread, "thread_updated")


@router.post("/threads/{thread_id}/terminate", operation_id="terminateThread", responses=ERRORS)
async def terminate_thread(thread_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.Thread:
    """End the thread and its descendants for good; later input gets 409."""
    thread = await threads.get(session, thread_id, who, lock=True)
    await control.terminate(session, thread)
    return await _announced(session, thread, "thread_updated")


@router.patch(
    "/threads/{thread_id}",
    operation_id="updateThread",
    responses={**ERRORS, **{status: {"model": schemas.Error} for status in (400, 413, 422)}},
)
async def update_thread(
    thread_id: uuid.UUID,
    body: schemas.ThreadPatch,
    session: SessionDep,
    who: CurrentUser,
    catalog: CatalogDep,
    fernet: FernetDep,
    limits: EnvLimits,
) -> schemas.Thread:
    """Change the thread's name, tags or env (secrets stay secret; `env_delete` removes values, before `env` is
    written). 413 past the env limits."""
    thread = await threads.get(session, thread_id, who, lock=True)
    environment.check(body.env, limits)
    unknown_secrets = sorted(set(body.secrets) - set(body.env))
    if unknown_secrets:
        raise errors.Invalid(f"`secrets` names variables not in `env`: {', '.join(unknown_secrets)}")
    if body.name is not None:
        thread.name = body.name
    if body.tags is not None:
        thread.tags = body.tags
    # read before the deletes: a secret deleted and set again in one request (a replacement) stays secret
    stored_secret = {n for n, t in (await environment.thread_types(session, thread.id)).items() if t == "secret"}
    if body.env_delete:
        await environment.delete_thread(session, thread.id, body.env_delete)
    if body.env:
        secret = set(body.secrets) | stored_secret | catalog.secret_names(thread.agent)
        await environment.set_thread(session, fernet, thread.id, body.env, secret, most=limits.variables)
    thread.updated_at = datetime.now(UTC)
    return await _announced(session, thread, "thread_updated")


@router.delete("/threads/{thread_id}", operation_id="deleteThread", responses=ERRORS)
async def delete_thread(thread_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> schemas.Deleted:
    """Delete the thread and all its descendants (children first); running work is abandoned."""
    thread = await threads.get(session, thread_id, who, lock=True)
    deleted = await control.delete(session, thread)
    await session.commit()
    return schemas.Deleted(deleted=deleted)
