"""Messages: post input to a thread's inbox, read its history."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.datastructures import FormData, UploadFile

from app import (
    attachments,
    children,
    db,
    engine,
    errors,
    events,
    inputs,
    messages,
    queue,
    statements,
    tables,
    threads,
    waits,
)
from app.api import bodies, forms, schemas
from app.api.deps import CatalogDep, CurrentUser, FernetDep, HubDep, RuntimeDep, SessionDep
from app.hub import Hub
from app.keys import Principal
from app.runtime import Runtime

router = APIRouter(tags=["messages"], route_class=bodies.Route)

ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": schemas.Error}, 404: {"model": schemas.Error}}


MAX_UPLOADS = schemas.MAX_FILES  # files in one multipart message
MAX_WAIT = 300  # seconds `?wait=` may ask for


async def _enqueue(
    session: AsyncSession,
    thread: tables.Thread,
    body: schemas.MessageIn,
    limit: int,
    uploads: list[UploadFile] | None = None,
) -> uuid.UUID:
    """Store the message's attachments under `/attachments/` and queue it for delivery, with the events the
    transaction holds; the thread runs it when a worker claims it (§2)."""
    if thread.terminated_at is not None:
        raise errors.ThreadTerminated()  # before any file is stored
    refs = await attachments.store_encoded(session, thread.id, body.attachments, limit)
    for upload in uploads or []:
        name = upload.filename or "file"
        refs.append(await attachments.store(session, thread.id, name, _chunks(upload), upload.content_type, limit))
    return await messages.enqueue(
        session,
        thread,
        body.role,
        body.content,
        silent=body.silent,
        metadata=body.metadata,
        attachments=refs,
        posted=True,
    )


async def _posted(
    sessions: async_sessionmaker[AsyncSession],
    session: AsyncSession,
    thread_id: uuid.UUID,
    who: Principal,
    payload: dict[str, Any],
) -> bool:
    """The usual message (no attachments to store) in one statement (`queue.post`): with no transaction around it,
    or, when the caller's key was just looked up, in that transaction (one connection per request: a second one
    taken while holding the first can wait forever on a full pool)."""
    user_id = None if who.admin else who.user_id
    if session.in_transaction():
        if not await queue.post(await statements.driver(session), thread_id, user_id, payload):
            return False
        await session.commit()
        return True
    async with db.alone(sessions) as driver:
        return await queue.post(driver, thread_id, user_id, payload)


async def _chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while piece := await upload.read(1024 * 1024):
        yield piece


def _validated(data: Any, files: int) -> schemas.MessageIn:
    try:
        return schemas.MessageIn.model_validate(data, context={"files": files})
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


def _from_form(form: FormData) -> tuple[schemas.MessageIn, list[UploadFile]]:
    """A multipart message: the `content`, `role`, `silent` and `metadata` (JSON) fields, every file part."""
    fields: dict[str, Any] = {}
    uploads: list[UploadFile] = []
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            uploads.append(value)
        elif key in ("content", "role"):
            fields[key] = bodies.text(value)
        elif key == "silent":
            fields[key] = {"true": True, "false": False}.get(value.strip().lower(), value)  # else: a 422
        elif key == "metadata":
            try:
                fields[key] = bodies.loads(value, at="metadata")
            except ValueError:
                raise errors.Invalid("The `metadata` field must be a JSON object.") from None
        else:
            raise errors.Invalid(f"Unknown field `{key}`: send `content`, `role`, `silent`, `metadata` and files.")
    if len(uploads) > MAX_UPLOADS:
        raise errors.Invalid(f"At most {MAX_UPLOADS} files per message.")
    return _validated(fields, len(uploads)), uploads


_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/MessageIn"}},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "content": {"type": "string", "maxLength": schemas.CONTENT_CHARS},
                    "role": {"type": "string", "enum": ["user", "assistant", "system"]},
                    "silent": {"type": "boolean"},
                    "metadata": {
                        "type": "object",
                        "description": f"a JSON object of at most {schemas.METADATA_BYTES} bytes",
                        "x-max-bytes": schemas.METADATA_BYTES,
                    },
                    "files": {
                        "type": "array",
                        "items": {
                            "type": "string",
                            "format": "binary",
                            schemas.BY_SETTING: {"x-max-bytes": "MAX_FILE_BYTES"},
                        },
                        "maxItems": MAX_UPLOADS,
                        "description": "file parts (any part with a file name)",
                    },
                },
                "additionalProperties": False,
                "allOf": [  # text or a file, as for JSON (the properties bound them; `allOf`: see `MessageIn`)
                    {
                        "anyOf": [
                            {
                                "required": ["content"],
                                "properties": {"content": {"type": "string", "pattern": schemas.TEXT}},
                            },
                            {"required": ["files"], "properties": {"files": {"type": "array", "minItems": 1}}},
                        ]
                    }
                ],
            },
            "encoding": {"metadata": {"contentType": "application/json"}},
        },
    },
}


@router.post(
    "/threads/{thread_id}/messages",
    operation_id="postMessage",
    status_code=202,
    response_model=schemas.Queued,
    responses={
        **ERRORS,
        200: {"model": schemas.Turn, "description": "With `wait`: the input's turn, ended or as far as it got."},
        409: {"model": schemas.Error},
        413: {"model": schemas.Error},
        415: {"model": schemas.Error},
    },
    openapi_extra={"requestBody": _BODY},
)
async def post_message(
    thread_id: uuid.UUID,
    request: Request,
    rt: RuntimeDep,
    hub: HubDep,
    session: SessionDep,
    who: CurrentUser,
    wait: Annotated[
        float | None,
        Query(
            gt=0,
            le=MAX_WAIT,
            description="seconds to wait for the input's turn to end; then 200 with its messages instead of 202",
        ),
    ] = None,
) -> schemas.Queued | JSONResponse:
    """Queue a message (JSON with base64 `attachments`, or multipart with files); a `user` message makes side A
    act. Attachments are stored under `/attachments/` in the thread's files. With `wait`, answer once the input's
    turn has ended (or after `wait` seconds, `done: false`) with the messages it wrote."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body: schemas.MessageIn | None = None
    if media != "multipart/form-data":
        try:
            body = schemas.MessageIn.model_validate_json(await request.body())
        except ValidationError as exc:
            await threads.get(session, thread_id, who)  # a thread the caller cannot see is not found, whatever the body
            raise RequestValidationError(exc.errors()) from None
    # with `wait`, where the log stood before the input was queued: its turn's events all come after
    after = None if wait is None else (await threads.get(session, thread_id, who)).event_seq
    message_id, parked = await _post(request, rt, session, thread_id, who, media, body)
    if wait is None or after is None:
        return schemas.Queued(message_id=message_id)
    turn = waits.Turn(message_id, parked=parked)
    return await _waited(request, rt, hub, who, thread_id, after, wait, turn)


async def _post(
    request: Request,
    rt: Runtime,
    session: AsyncSession,
    thread_id: uuid.UUID,
    who: Principal,
    media: str,
    body: schemas.MessageIn | None,
) -> tuple[uuid.UUID, bool]:
    """Queue the message; its id, and whether the thread stays parked (a stopped thread a `system` message does not
    wake)."""
    if body is not None and not body.attachments:  # the usual message
        message_id, payload = messages.payload(body.role, body.content, silent=body.silent, metadata=body.metadata)
        if await _posted(rt.sessions, session, thread_id, who, payload):
            return message_id, False
    # attachments to store, or a thread that is not found, terminated or stopped: in a transaction
    thread = await threads.get(session, thread_id, who, lock=True)
    events.hold(session, thread.id)  # the row is locked: its events go with its changes in one statement at the end
    if body is None:
        async with forms.multipart(request, max_files=MAX_UPLOADS + 1, max_fields=50) as form:
            body, uploads = _from_form(form)
            message_id = await _enqueue(session, thread, body, rt.settings.max_file_bytes, uploads)
    else:
        message_id = await _enqueue(session, thread, body, rt.settings.max_file_bytes)
    await events.flush(session, thread)
    await statements.write(session)
    await session.commit()
    return message_id, thread.stopped


async def _waited(
    request: Request,
    rt: Runtime,
    hub: Hub,
    who: Principal,
    thread_id: uuid.UUID,
    after: int,
    seconds: float,
    turn: waits.Turn,
) -> JSONResponse:
    """Follow the input's turn for at most `seconds`, until the client hangs up (then nothing is read more) or
    the server begins to stop, holding no connection meanwhile; then the turn as it stands."""
    factory = rt.sessions
    if not turn.over:
        following = asyncio.ensure_future(waits.follow(hub, factory, thread_id, who.key_id, after, turn))
        gone = asyncio.ensure_future(_hung_up(request))
        stopping = asyncio.ensure_future(rt.stopping.wait())  # a deploy: answer what there is
        try:
            await asyncio.wait({following, gone, stopping}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (following, gone, stopping):
                task.cancel()
            await asyncio.gather(following, gone, stopping, return_exceptions=True)
        if gone.done() and not gone.cancelled():
            return JSONResponse({}, status_code=499)  # nobody reads it
        if not following.cancelled() and (failed := following.exception()) is not None:
            raise failed  # the database's trouble: the usual 503
    async with factory() as session:
        thread = await threads.get(session, thread_id, who)
        ids = [turn.message_id, *turn.produced]  # the input itself even if its delivery came after the wait ended
        out = await _projected(session, await messages.of_turn(session, thread.id, ids, turn.message_id))
        if not out and (row := await waits.queued(session, thread.id, turn.message_id)) is not None:
            out.append(_queued(row))  # still waiting, or set aside
    status = turn.status if turn.done and turn.status in waits.RESTING else thread.status
    result = schemas.Turn(
        message_id=turn.message_id,
        done=turn.done,
        status=status,
        outcome=turn.outcome,
        error=turn.error,
        messages=out,
    )
    return JSONResponse(result.model_dump(mode="json"))


async def _hung_up(request: Request) -> None:
    """Returns once the client has gone (the body was read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _projected(session: AsyncSession, rows: list[tables.Message]) -> list[schemas.Message]:
    """Messages with the `subagent_*` fields of the child they speak for."""
    if not rows:
        return []
    ids = {r.subagent_id for r in rows if r.subagent_id is not None}
    extra = await children.projections(session, rows[0].thread_id, ids)
    return [
        schemas.Message.model_validate({**messages.to_dict(r), **extra.get(r.subagent_id or uuid.UUID(int=0), {})})
        for r in rows
    ]


def _id_of(value: Any, inbox_id: int) -> uuid.UUID:
    """The queued message's id; a malformed row (set aside for it) gets one derived from its inbox row."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"inbox:{inbox_id}")


def _queued(row: tables.Inbox) -> schemas.Message:
    """Input not delivered yet (`pending`), or set aside because its delivery kept failing (`failed`, with why)."""
    p = row.payload
    why = {"code": waits.SET_ASIDE, "message": row.error or ""}
    aside = {"set_aside": True, "error": why} if row.set_aside_at is not None else {}
    role = str(p.get("role")) if p.get("role") in ("user", "assistant", "system") else "user"
    return schemas.Message(
        id=_id_of(p.get("id"), row.id),
        role=role,
        side=messages.side_of(role),
        content=p.get("content"),
        name=None,
        tool_calls=None,
        tool_call_id=None,
        tool_status=None,
        status=messages.Status.FAILED if aside else messages.Status.PENDING,
        silent=bool(p.get("silent")),
        depth=0,
        parent_id=None,
        attachments=p.get("attachments") or [],
        reasoning_content=None,
        metadata={**(p.get("metadata") or {}), "queued": True, **aside},
        subagent_id=None,
        model=None,
        usage=None,
        created_at=row.created_at,
    )


@router.get("/threads/{thread_id}/messages", operation_id="listMessages", responses=ERRORS)
async def list_messages(
    thread_id: uuid.UUID,
    session: SessionDep,
    who: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: schemas.Cursor = None,
    order: Literal["asc", "desc"] = "asc",
    include_silent: bool = False,
    depth: Annotated[int, Query(ge=0, le=100)] = 0,
    since_id: uuid.UUID | None = None,
) -> schemas.MessageList:
    """A page of history (newest page first, older pages through `cursor`), plus queued input."""
    thread = await threads.get(session, thread_id, who)
    # queued input first: read after the history, a delivery committing in between would hide a message from both
    waiting = await queue.pending(session, thread.id) if cursor is None else []
    rows, next_cursor = await messages.page(
        session,
        thread.id,
        limit=limit,
        cursor=cursor,
        order=order,
        include_silent=include_silent,
        depth=depth,
        since_id=since_id,
    )
    out = await _projected(session, rows)
    if cursor is None:
        delivered = {m.id for m in out}  # delivered since it was read as queued: shown once, as delivered
        queued = [
            q
            for q in (_queued(r) for r in waiting if r.kind == inputs.Kind.MESSAGE)
            if q.id not in delivered and (include_silent or not q.silent)
        ]
        out = out + queued if order == "asc" else queued[::-1] + out
    return schemas.MessageList(messages=out, next_cursor=next_cursor)


@router.get("/threads/{thread_id}/messages/{message_id}", operation_id="getMessage", responses=ERRORS)
async def get_message(
    thread_id: uuid.UUID, message_id: uuid.UUID, session: SessionDep, who: CurrentUser
) -> schemas.Message:
    """One message."""
    thread = await threads.get(session, thread_id, who)
    [message] = await _projected(session, [await messages.get(session, thread.id, message_id)])
    return message


@router.patch(
    "/threads/{thread_id}/messages/{message_id}",
    operation_id="editMessage",
    responses={**ERRORS, 409: {"model": schemas.Error}},
)
async def edit_message(
    thread_id: uuid.UUID,
    message_id: uuid.UUID,
    body: schemas.MessageEdit,
    session: SessionDep,
    who: CurrentUser,
    catalog: CatalogDep,
    fernet: FernetDep,
) -> schemas.Message:
    """Replace a stored message's content through the update hooks (`before_update_message`,
    `after_update_message`); announced as `message_data`, seen by the thread's next step. 409 `message_busy` while
    the message is still being written (`pending`, or queued input)."""
    thread = await threads.get(session, thread_id, who, lock=True)
    row = await engine.edit_message(session, catalog, fernet, thread, message_id, body.content)
    [message] = await _projected(session, [row])
    await session.commit()
    return message


@router.delete(
    "/threads/{thread_id}/messages/{message_id}",
    operation_id="deleteMessage",
    status_code=204,
    response_class=Response,
    responses={**ERRORS, 409: {"model": schemas.Error}},
)
async def delete_message(thread_id: uuid.UUID, message_id: uuid.UUID, session: SessionDep, who: CurrentUser) -> None:
    """Delete a stored message; a message that made tool calls takes their results with it. Each deleted message is
    announced as `message_deleted`. 409 `tool_result_alone` for a tool result whose call is still there,
    `message_busy` while the thread's step still writes or uses the message."""
    thread = await threads.get(session, thread_id, who, lock=True)
    await engine.delete_message(session, thread, message_id)
    await session.commit()
