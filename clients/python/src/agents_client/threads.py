"""Threads: create, read, list, change, delete; stop, continue, terminate; their subagents and logs."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from agents_client import call, models
from agents_client.call import Call, ThreadRef

Status = Literal["idle", "queued", "running", "waiting", "stopped", "terminated"]


def _create(
    agent: str,
    env: Mapping[str, str] | None,
    secrets: Sequence[str],
    tags: Sequence[str],
    name: str | None,
    messages: Sequence[str | Mapping[str, Any]],
) -> Call[models.Thread]:
    body: dict[str, Any] = {"agent": agent, "env": dict(env or {}), "secrets": list(secrets), "tags": list(tags)}
    if name is not None:
        body["name"] = name
    if messages:
        body["messages"] = [{"content": m} if isinstance(m, str) else dict(m) for m in messages]
    return Call("POST", "/threads", call.model(models.Thread), json=body)


def _list(
    agent: str | None,
    tag: str | None,
    parent_id: str | uuid.UUID | None,
    status: Status | None,
    limit: int | None,
    cursor: str | None,
) -> Call[models.ThreadList]:
    params = call.query(agent=agent, tag=tag, parent_id=parent_id, status=status, limit=limit, cursor=cursor)
    return Call("GET", "/threads", call.model(models.ThreadList), params=params)


def _update(
    thread: ThreadRef,
    name: str | None,
    tags: Sequence[str] | None,
    env: Mapping[str, str] | None,
    secrets: Sequence[str],
    env_delete: Sequence[str],
) -> Call[models.Thread]:
    body: dict[str, Any] = {"env": dict(env or {}), "secrets": list(secrets), "env_delete": list(env_delete)}
    if name is not None:
        body["name"] = name
    if tags is not None:
        body["tags"] = list(tags)
    return Call("PATCH", call.thread_path(thread), call.model(models.Thread), json=body)


def _get(thread: ThreadRef) -> Call[models.Thread]:
    return Call("GET", call.thread_path(thread), call.model(models.Thread))


def _delete(thread: ThreadRef) -> Call[models.Deleted]:
    return Call("DELETE", call.thread_path(thread), call.model(models.Deleted))


def _control(thread: ThreadRef, action: str, body: Any = None) -> Call[models.Thread]:
    return Call("POST", call.thread_path(thread, action), call.model(models.Thread), json=body)


def _subagents(thread: ThreadRef) -> Call[models.SubagentList]:
    return Call("GET", call.thread_path(thread, "subagents"), call.model(models.SubagentList))


def _logs(thread: ThreadRef, kind: str | None, limit: int | None, cursor: str | None) -> Call[models.LogList]:
    params = call.query(kind=kind, limit=limit, cursor=cursor)
    return Call("GET", call.thread_path(thread, "logs"), call.model(models.LogList), params=params)


def _log(thread: ThreadRef, log_id: uuid.UUID | str) -> Call[models.LogDetail]:
    return Call("GET", call.thread_path(thread, "logs", call.segment(log_id)), call.model(models.LogDetail))


class Threads:
    def __init__(self, send: call.Sender) -> None:
        self._send = send

    def create(
        self,
        agent: str,
        *,
        env: Mapping[str, str] | None = None,
        secrets: Sequence[str] = (),
        tags: Sequence[str] = (),
        name: str | None = None,
        messages: Sequence[str | Mapping[str, Any]] = (),
    ) -> models.Thread:
        """A new thread of `agent`; `messages` (texts, or message bodies) are queued in order."""
        return self._send(_create(agent, env, secrets, tags, name, messages))

    def get(self, thread: ThreadRef) -> models.Thread:
        return self._send(_get(thread))

    def list(
        self,
        *,
        agent: str | None = None,
        tag: str | None = None,
        parent_id: str | uuid.UUID | None = None,
        status: Status | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.ThreadList:
        """A page of the caller's threads, newest first (`parent_id="none"`: top-level ones)."""
        return self._send(_list(agent, tag, parent_id, status, limit, cursor))

    def update(
        self,
        thread: ThreadRef,
        *,
        name: str | None = None,
        tags: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Sequence[str] = (),
        env_delete: Sequence[str] = (),
    ) -> models.Thread:
        return self._send(_update(thread, name, tags, env, secrets, env_delete))

    def delete(self, thread: ThreadRef) -> models.Deleted:
        """Delete the thread and its descendants; the ids deleted."""
        return self._send(_delete(thread))

    def stop(self, thread: ThreadRef) -> models.Thread:
        return self._send(_control(thread, "stop"))

    def continue_(self, thread: ThreadRef, side: Literal["a", "b"] = "a") -> models.Thread:
        return self._send(_control(thread, "continue", {"side": side}))

    def terminate(self, thread: ThreadRef) -> models.Thread:
        return self._send(_control(thread, "terminate"))

    def subagents(self, thread: ThreadRef) -> models.SubagentList:
        return self._send(_subagents(thread))

    def logs(
        self,
        thread: ThreadRef,
        *,
        kind: Literal["llm", "tool", "hook"] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.LogList:
        return self._send(_logs(thread, kind, limit, cursor))

    def log(self, thread: ThreadRef, log_id: uuid.UUID | str) -> models.LogDetail:
        """One log, with the whole request its model call was sent when `LOG_REQUESTS=full` kept it."""
        return self._send(_log(thread, log_id))


class AsyncThreads:
    def __init__(self, send: call.AsyncSender) -> None:
        self._send = send

    async def create(
        self,
        agent: str,
        *,
        env: Mapping[str, str] | None = None,
        secrets: Sequence[str] = (),
        tags: Sequence[str] = (),
        name: str | None = None,
        messages: Sequence[str | Mapping[str, Any]] = (),
    ) -> models.Thread:
        """A new thread of `agent`; `messages` (texts, or message bodies) are queued in order."""
        return await self._send(_create(agent, env, secrets, tags, name, messages))

    async def get(self, thread: ThreadRef) -> models.Thread:
        return await self._send(_get(thread))

    async def list(
        self,
        *,
        agent: str | None = None,
        tag: str | None = None,
        parent_id: str | uuid.UUID | None = None,
        status: Status | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.ThreadList:
        """A page of the caller's threads, newest first (`parent_id="none"`: top-level ones)."""
        return await self._send(_list(agent, tag, parent_id, status, limit, cursor))

    async def update(
        self,
        thread: ThreadRef,
        *,
        name: str | None = None,
        tags: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Sequence[str] = (),
        env_delete: Sequence[str] = (),
    ) -> models.Thread:
        return await self._send(_update(thread, name, tags, env, secrets, env_delete))

    async def delete(self, thread: ThreadRef) -> models.Deleted:
        """Delete the thread and its descendants; the ids deleted."""
        return await self._send(_delete(thread))

    async def stop(self, thread: ThreadRef) -> models.Thread:
        return await self._send(_control(thread, "stop"))

    async def continue_(self, thread: ThreadRef, side: Literal["a", "b"] = "a") -> models.Thread:
        return await self._send(_control(thread, "continue", {"side": side}))

    async def terminate(self, thread: ThreadRef) -> models.Thread:
        return await self._send(_control(thread, "terminate"))

    async def subagents(self, thread: ThreadRef) -> models.SubagentList:
        return await self._send(_subagents(thread))

    async def logs(
        self,
        thread: ThreadRef,
        *,
        kind: Literal["llm", "tool", "hook"] | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> models.LogList:
        return await self._send(_logs(thread, kind, limit, cursor))

    async def log(self, thread: ThreadRef, log_id: uuid.UUID | str) -> models.LogDetail:
        """One log, with the whole request its model call was sent when `LOG_REQUESTS=full` kept it."""
        return await self._send(_log(thread, log_id))
