"""The message methods of `ThreadState` (§12): read, inject, queue, update and delete the thread's messages."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app import attachments, children, db, errors, files, messages, tables
from app.engine import edits, hooks, types
from app.spec.results import ToolAttachment
from app.spec.state import AttachmentRef, ExecutionState, MessagesResult, StateMessage

INJECT_ROLES = ("user", "assistant", "system")
QUEUE_ROLES = ("user", "assistant")


def own(execution: ExecutionState | None, method: str) -> None:
    """Refuse a write that would race the running step: only the thread's own execution makes it (§12)."""
    if execution is None:
        raise errors.OutsideExecution(
            f"`state.{method}` is only allowed inside the thread's own execution (it would race the running step)"
        )


class Messages:
    """A thread's messages as a `RunState` offers them (it delegates its message methods here): each call one short
    transaction on the thread (fenced inside an execution); the writes that would race the running step only inside
    it (`own`). `hooks_in(transaction)` gives the acting side's hooks, their state running in `transaction`.
    `context`: the state's; when it names the effect whose handler holds the state (`effect_runs`), the messages it
    queues say so in their metadata (`source: effect`, the effect's name), under whatever metadata the handler gives."""

    def __init__(
        self,
        transaction: types.Transaction,
        execution: ExecutionState | None,
        hooks_in: Callable[[types.Transaction], hooks.Hooks],
        context: dict[str, Any],
    ) -> None:
        self._transaction = transaction
        self._execution = execution
        self._hooks_in = hooks_in
        effect = context.get("effect")
        self._source = None if effect is None else {"source": "effect", "effect": effect["name"]}

    async def get_messages(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
        include_silent: bool = False,
        max_depth: int = 0,
    ) -> MessagesResult:
        check_page(limit, offset)
        async with self._transaction() as (session, thread):
            rows, total = await messages.window(
                session,
                thread.id,
                offset=offset,
                limit=limit,
                descending=order != "asc",
                include_silent=include_silent,
                max_depth=max_depth,
            )
            extra = await _projections(session, thread.id, rows)
        return MessagesResult(
            messages=[state_message(r, extra) for r in rows],
            total=total,
            has_more=offset + len(rows) < total,
        )

    async def get_message(self, message_id: str) -> StateMessage | None:
        key = as_uuid(message_id)
        if key is None:
            return None
        async with self._transaction() as (session, thread):
            try:
                row = await messages.get(session, thread.id, key)
            except errors.MessageNotFound:
                return None
            return state_message(row, await _projections(session, thread.id, [row]))

    async def inject_message(
        self,
        role: Literal["user", "assistant", "system"],
        content: str,
        *,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> StateMessage:
        own(self._execution, "inject_message")
        _check_input(role, INJECT_ROLES, content, metadata)
        # the acting side's hooks, as for the engine's messages; a create-message hook's own injections run none
        # (they would recurse)
        hook_runner = None if hooks.creating() else self._hooks_in(self._transaction)
        fields: dict[str, Any] = {"content": content, "silent": silent, "metadata_": metadata or {}}
        if hook_runner is not None:
            fields = await hook_runner.before_create_message(role, fields)
        async with self._transaction() as (session, thread):
            row = await messages.add(session, thread.id, role, session_number=thread.session_number, **fields)
            thread.last_message_at = row.created_at
        if hook_runner is not None:
            await hook_runner.after_create_message(row)
        return state_message(row)

    async def queue_message(
        self,
        role: Literal["user", "assistant"],
        content: str,
        *,
        attachments: Sequence[ToolAttachment | AttachmentRef | str] | None = None,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        _check_input(role, QUEUE_ROLES, content, metadata)
        if self._source is not None:
            metadata = {**self._source, **(metadata or {})}
        given = _attachments(attachments)
        async with self._transaction() as (session, thread):
            if thread.terminated_at is not None:
                raise errors.ThreadTerminated()  # before any file is stored
            refs = [await _attachment(session, thread.id, item) for item in given]
            message_id = await messages.enqueue(
                session, thread, role, content, silent=silent, metadata=metadata, attachments=refs
            )
        return str(message_id)

    async def update_message(
        self, message_id: str, *, content: str | None = None, metadata: dict[str, Any] | None = None
    ) -> StateMessage:
        own(self._execution, "update_message")
        refuse_nul(content, metadata)
        key = as_uuid(message_id)
        if key is None:
            raise errors.MessageNotFound(f"Message {message_id} not found")
        changes: dict[str, Any] = {}
        if content is not None:
            changes["content"] = content
        if metadata is not None:
            changes["metadata_"] = metadata
        async with self._transaction() as (session, thread):
            row = await messages.get(session, thread.id, key)
            if hooks.updating():  # an update hook's own update runs no update hooks: it would recurse
                await messages.save(session, row, **changes)
            else:  # through the acting side's update hooks, run inside this transaction as the engine's own updates
                await edits.update(session, self._hooks_in(hooks.Joined(session, thread)), row, changes)
            return state_message(row, await _projections(session, thread.id, [row]))

    async def delete_message(self, message_id: str) -> bool:
        """Deleted as the HTTP delete deletes (`edits.delete`): a tool-call message with its results, never a result
        alone (`ToolResultAlone`) nor what the running step still uses (`MessageBusy`)."""
        own(self._execution, "delete_message")
        key = as_uuid(message_id)
        if key is None:
            return False
        async with self._transaction() as (session, thread):
            try:
                return bool(await edits.delete(session, thread, key))
            except errors.MessageNotFound:
                return False


def state_message(row: tables.Message, projected: dict[uuid.UUID, dict[str, Any]] | None = None) -> StateMessage:
    extra = (projected or {}).get(row.subagent_id) if row.subagent_id is not None else None
    return StateMessage.model_validate({**messages.to_dict(row), **(extra or {})})


async def _projections(
    session: AsyncSession, thread_id: uuid.UUID, rows: list[tables.Message]
) -> dict[uuid.UUID, dict[str, Any]]:
    """The `subagent_*` fields of the rows that speak for a child (a query only when one does)."""
    return await children.projections(session, thread_id, {r.subagent_id for r in rows if r.subagent_id})


def _attachments(items: Any) -> list[ToolAttachment | AttachmentRef]:
    """`queue_message`'s attachments as models: a new file (`name`, `mime_type`, base64 `data`) or a file of the
    thread (a path, or a reference with `path`)."""
    if items is None:
        return []
    if isinstance(items, str | bytes | dict) or not isinstance(items, Sequence):
        raise errors.Invalid("`attachments` must be a list")
    out: list[ToolAttachment | AttachmentRef] = []
    for item in items:
        try:
            if isinstance(item, ToolAttachment | AttachmentRef):
                out.append(item)
            elif isinstance(item, str):
                out.append(AttachmentRef(path=item))
            elif isinstance(item, dict) and "data" in item:
                out.append(ToolAttachment.model_validate(item))
            elif isinstance(item, dict) and "path" in item:
                out.append(AttachmentRef.model_validate(item))
            else:
                raise errors.Invalid("each attachment is a path, a reference with `path`, or a new file")
        except ValidationError as exc:
            raise errors.Invalid(f"invalid attachment: {exc.errors()[0]['msg']}") from exc
    refuse_nul(*(a.model_dump() for a in out))
    return out


async def _attachment(
    session: AsyncSession, thread_id: uuid.UUID, item: ToolAttachment | AttachmentRef
) -> dict[str, Any]:
    """A message's reference to the attachment: a new file is stored under `/attachments/` (code's own output is
    not refused for its size, as a tool's is not); a path must name a file of the thread."""
    if isinstance(item, ToolAttachment):
        data = attachments.decode(item.data, item.name)
        limit = max(files.DEFAULT_LIMIT, len(data))
        return await attachments.store(session, thread_id, item.name, data, item.mime_type, limit)
    try:
        entry = await files.stat(session, thread_id, item.path)
    except errors.FileNotFound:
        entry = None
    if entry is None or entry.is_dir:
        raise errors.FileNotFound(f"Attachment not found: {item.path}", path=item.path)
    return attachments.reference(entry, item.name)


def as_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise errors.Invalid("`limit` and `offset` must not be negative")


def _check_input(role: str, roles: tuple[str, ...], content: Any, metadata: Any) -> None:
    if role not in roles:
        raise errors.Invalid(f"`role` must be one of {', '.join(roles)}, not {role!r}")
    if not isinstance(content, str):
        raise errors.Invalid("`content` must be a string")
    if metadata is not None and not isinstance(metadata, dict):
        raise errors.Invalid("`metadata` must be a dict")
    refuse_nul(content, metadata)


def refuse_nul(*values: Any) -> None:
    """Postgres cannot store NUL characters; refuse them before they reach the driver."""
    if db.has_nul(list(values)):
        raise errors.Invalid(db.NUL_REFUSED)
