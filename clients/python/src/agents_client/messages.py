"""Messages: post input (JSON, or multipart with files; `wait` for its turn), read, edit and delete history."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import IO, Any, Literal, overload

from agents_client import call, models
from agents_client.call import Call, ThreadRef

Role = Literal["user", "assistant", "system"]
# a file to attach: (name, bytes or a binary file, media type)
Attachment = tuple[str, bytes | IO[bytes], str]
WAIT_MARGIN = 30.0  # seconds the read may take beyond `wait`: the server answers at `wait` at the latest


def _post(
    thread: ThreadRef,
    content: str | None,
    role: Role,
    attachments: Sequence[Attachment],
    silent: bool,
    metadata: Mapping[str, Any] | None,
    wait: float | None,
) -> Call[Any]:
    path = call.thread_path(thread, "messages")
    params = call.query(wait=wait)
    read = call.model(models.Queued) if wait is None else call.model(models.Turn)
    timeout = None if wait is None else wait + WAIT_MARGIN
    if not attachments:
        body: dict[str, Any] = {"content": content, "role": role, "silent": silent, "metadata": dict(metadata or {})}
        return Call("POST", path, read, params=params, json=body, timeout=timeout)
    fields = {"role": role, "silent": "true" if silent else "false", "metadata": json.dumps(dict(metadata or {}))}
    if content is not None:
        fields["content"] = content
    files = [("files", (name, data, mime_type)) for name, data, mime_type in attachments]
    return Call("POST", path, read, params=params, data=fields, files=files, timeout=timeout)


def _list(
    thread: ThreadRef,
    limit: int | None,
    cursor: str | None,
    order: Literal["asc", "desc"] | None,
    include_silent: bool | None,
    depth: int | None,
    since_id: str | uuid.UUID | None,
) -> Call[models.MessageList]:
    params = call.query(
        limit=limit, cursor=cursor, order=order, include_silent=include_silent, depth=depth, since_id=since_id
    )
    return Call("GET", call.thread_path(thread, "messages"), call.model(models.MessageList), params=params)


def _one(method: str, thread: ThreadRef, message: str | uuid.UUID, body: Any = None) -> Call[models.Message]:
    path = call.thread_path(thread, "messages", call.segment(message))
    return Call(method, path, call.model(models.Message), json=body)


def _delete(thread: ThreadRef, message: str | uuid.UUID) -> Call[None]:
    return Call("DELETE", call.thread_path(thread, "messages", call.segment(message)), call.nothing)


class Messages:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    @overload
    def post(
        self,
        thread: ThreadRef,
        content: str | None = None,
        *,
        role: Role = "user",
        attachments: Sequence[Attachment] = (),
        silent: bool = False,
        metadata: Mapping[str, Any] | None = None,
        wait: None = None,
    ) -> models.Queued: ...

    @overload
    def post(
        self,
        thread: ThreadRef,
        content: str | None = None,
        *,
        role: Role = "user",
        attachments: Sequence[Attachment] = (),
        silent: bool = False,
        metadata: Mapping[str, Any] | None = None,
        wait: float,
    ) -> models.Turn: ...

    def post(
        self,
        thread: ThreadRef,
        content: str | None = None,
        *,
        role: Role = "user",
        attachments: Sequence[Attachment] = (),
        silent: bool = False,
        metadata: Mapping[str, Any] | None = None,
        wait: float | None = None,
    ) -> models.Queued | models.Turn:
        """Queue a message (`Queued`); with `wait` (seconds, at most 300) the `Turn` it started or joined, once it
        ended (`done`) or when the time is up. `attachments` are sent as multipart files."""
        result: models.Queued | models.Turn = self._send(
            _post(thread, content, role, attachments, silent, metadata, wait)
        )
        return result

    def list(
        self,
        thread: ThreadRef,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        order: Literal["asc", "desc"] | None = None,
        include_silent: bool | None = None,
        depth: int | None = None,
        since_id: str | uuid.UUID | None = None,
    ) -> models.MessageList:
        """A page of history (the newest `limit`; `cursor` for older pages), with queued input as `pending`."""
        return self._send(_list(thread, limit, cursor, order, include_silent, depth, since_id))

    def get(self, thread: ThreadRef, message: str | uuid.UUID) -> models.Message:
        return self._send(_one("GET", thread, message))

    def edit(self, thread: ThreadRef, message: str | uuid.UUID, content: str) -> models.Message:
        """Replace a stored message's text."""
        return self._send(_one("PATCH", thread, message, {"content": content}))

    def delete(self, thread: ThreadRef, message: str | uuid.UUID) -> None:
        """Delete a stored message (one that made tool calls with their results)."""
        self._send(_delete(thread, message))


class AsyncMessages:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    @overload
    async def post(
        self,
        thread: ThreadRef,
        content: str | None = None,
        *,
        role: Role = "user",
        attachments: Sequence[Attachment] = (),
        silent: bool = False,
        metadata: Mapping[str, Any] | None = None,
        wait: None = None,
    ) -> models.Queued: ...

    @overload
    async def post(
        self,
        thread: ThreadRef,
        content: str | None = None,
        *,
        role: Role = "user",
        attachments: Sequence[Attachment] = (),
        silent: bool = False,
        metadata: Mapping[str, Any] | None = None,
        wait: float,
    ) -> models.Turn: ...

    async def post(
        self,
        thread: ThreadRef,
        content: str | None = None,
        *,
        role: Role = "user",
        attachments: Sequence[Attachment] = (),
        silent: bool = False,
        metadata: Mapping[str, Any] | None = None,
        wait: float | None = None,
    ) -> models.Queued | models.Turn:
        """Queue a message (`Queued`); with `wait` (seconds, at most 300) the `Turn` it started or joined, once it
        ended (`done`) or when the time is up. `attachments` are sent as multipart files."""
        result: models.Queued | models.Turn = await self._send(
            _post(thread, content, role, attachments, silent, metadata, wait)
        )
        return result

    async def list(
        self,
        thread: ThreadRef,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        order: Literal["asc", "desc"] | None = None,
        include_silent: bool | None = None,
        depth: int | None = None,
        since_id: str | uuid.UUID | None = None,
    ) -> models.MessageList:
        """A page of history (the newest `limit`; `cursor` for older pages), with queued input as `pending`."""
        return await self._send(_list(thread, limit, cursor, order, include_silent, depth, since_id))

    async def get(self, thread: ThreadRef, message: str | uuid.UUID) -> models.Message:
        return await self._send(_one("GET", thread, message))

    async def edit(self, thread: ThreadRef, message: str | uuid.UUID, content: str) -> models.Message:
        """Replace a stored message's text."""
        return await self._send(_one("PATCH", thread, message, {"content": content}))

    async def delete(self, thread: ThreadRef, message: str | uuid.UUID) -> None:
        """Delete a stored message (one that made tool calls with their results)."""
        await self._send(_delete(thread, message))
