"""Hooks (`semantics.md` §10): the ones active for a prompt, run in order; one that fails changes nothing.

Each run leaves a `logs` row (kind `hook`): one that failed, its error; one that returned, its time. A prompt without
hooks runs none and writes nothing. The rows of the hooks that returned ride with the next statement of the
transaction they joined (`Joined`); run between transactions, with what their caller writes next (`kept`: a tool
result's row), else in a transaction of their own.
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncSession

from app import events, logs, masking, messages, tables, tracing
from app.catalog import Catalog
from app.engine import types
from app.engine.transcript import visible_rows
from app.spec.define import HookDefinition
from app.spec.definitions import AgentDefinition, PromptDefinition, Side
from app.spec.messages import LLMMessage, ToolCall
from app.spec.results import ToolResult
from app.spec.state import StateMessage, ThreadState

log = logging.getLogger(__name__)

# the message fields `before_create_message` / `before_update_message` may change, with their types
EDITABLE: dict[str, tuple[type, ...]] = {"content": (str, type(None)), "metadata": (dict,), "silent": (bool,)}
_SHOWN = ("id", "role", "side", "content", "name", "tool_call_id", "tool_status", "status", "silent", "attachments")


# the hook running in this task, if any: a message a create-message hook injects runs no hooks (it would recurse)
_running: ContextVar[str | None] = ContextVar("hook", default=None)


def creating() -> bool:
    """Whether a `before_create_message` or `after_create_message` hook is running in this task."""
    return _running.get() in ("before_create_message", "after_create_message")


def updating() -> bool:
    """Whether a `before_update_message` or `after_update_message` hook is running in this task."""
    return _running.get() in ("before_update_message", "after_update_message")


class BadReturn(TypeError):
    """A hook returned something of the wrong type."""


def active(catalog: Catalog, agent: AgentDefinition, prompt: PromptDefinition) -> list[HookDefinition]:
    """The prompt's hooks if it sets `hooks` at all, else the agent's, in list order."""
    ids = prompt.hooks if prompt.hooks is not None else agent.hooks or []
    return [catalog.hooks[i] for i in ids]


@asynccontextmanager
async def joined(session: AsyncSession, thread: tables.Thread) -> AsyncIterator[tuple[AsyncSession, tables.Thread]]:
    """The caller's open transaction, for hooks run inside it (a savepoint: the thread row is already locked)."""
    async with events.written_at_once(session), session.begin_nested():
        yield session, thread


class Joined:
    """The caller's open transaction as hooks' transaction (`joined`), with the session the rows of the hooks that
    ran ride in."""

    def __init__(self, session: AsyncSession, thread: tables.Thread) -> None:
        self.session = session
        self.thread = thread

    def __call__(self) -> AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]:
        return joined(self.session, self.thread)


@dataclass(frozen=True)
class Ran:
    """A hook that ran and returned: its hook point, its name, how long it took."""

    hook: str
    name: str
    latency_ms: float

    def row(self, thread_id: uuid.UUID) -> tables.Log:
        return logs.hook_run(thread_id, hook=self.hook, name=self.name, latency_ms=self.latency_ms)


# the hooks run in this task that returned, kept for the caller to write (`kept`), if it asked
_kept: ContextVar[list[Ran] | None] = ContextVar("hooks_kept", default=None)


@contextmanager
def kept() -> Iterator[list[Ran]]:
    """The hooks that run and return inside (outside any transaction they joined), for the caller to write with
    what it writes next (`Ran.row`), instead of in a transaction of their own."""
    ran: list[Ran] = []
    token = _kept.set(ran)
    try:
        yield ran
    finally:
        _kept.reset(token)


def tagged(fields: dict[str, Any], tags: dict[str, Any]) -> dict[str, Any]:
    """`fields` as the hooks left them, with the engine's own metadata (`tags["metadata_"]`: a subprompt run's
    crash-safety tags) put back wherever hooks set the metadata: a hook that replaces it cannot hide the message
    from the clean-up of an interrupted run."""
    engine = tags.get("metadata_")
    if not engine or "metadata_" not in fields:
        return fields
    return {**fields, "metadata_": {**(fields["metadata_"] or {}), **engine}}


class Hooks:
    """The active hooks of one prompt, bound to the state they get (made by `state.py`, which builds on this
    module); each runs on a copy of its input."""

    def __init__(
        self,
        definitions: Sequence[HookDefinition] = (),
        state: ThreadState | None = None,
        transaction: types.Transaction | None = None,
        secrets: Sequence[str] = (),
    ) -> None:
        self._by_name: dict[str, list[HookDefinition]] = {}
        for definition in definitions:
            self._by_name.setdefault(definition.hook, []).append(definition)
        self._state = state
        self._transaction = transaction
        self._secrets = [s for s in secrets if s]

    @property
    def none(self) -> bool:
        """Whether no hook is active (what the engine writes then goes unseen until it commits)."""
        return not self._by_name

    def runs(self, hook: str) -> bool:
        """Whether any active hook is of this kind."""
        return hook in self._by_name

    async def filter_messages(
        self, rows: list[tables.Message], side: Side, prompt: PromptDefinition, turn_start: int
    ) -> list[tables.Message]:
        """The rows to assemble: the visible ones as the `filter_messages` hooks leave them."""
        if "filter_messages" not in self._by_name:
            return rows
        visible = visible_rows(rows, side, prompt, turn_start)
        shown = [StateMessage.model_validate(messages.to_dict(r)) for r in visible]
        kept = await self._chain("filter_messages", shown, check=_state_messages)
        if kept is shown:
            return visible
        by_id = {str(r.id): r for r in visible}
        out: list[tables.Message] = []
        for message in kept:
            out.append(_row(message, by_id.get(message.id), out[-1] if out else None))
        return out

    async def prefilter_llm_history(self, history: list[LLMMessage]) -> list[LLMMessage]:
        """The messages the model is sent."""
        result: list[LLMMessage] = await self._chain("prefilter_llm_history", history, check=_llm_messages)
        return result

    async def before_create_message(self, role: str, fields: dict[str, Any]) -> dict[str, Any]:
        """`messages.add` fields with the hooks' edits of `content`, `metadata`, `silent`."""
        return await self._edit("before_create_message", {"role": role, **fields}, "metadata_", drop=("role",))

    async def before_delivery(self, payload: dict[str, Any]) -> dict[str, Any]:
        """An inbox message's payload with the `before_create_message` hooks' edits."""
        return await self._edit("before_create_message", payload, "metadata")

    async def after_create_message(self, row: tables.Message) -> None:
        await self._notify("after_create_message", row)

    async def before_update_message(self, row: tables.Message, updates: dict[str, Any]) -> dict[str, Any]:
        """`messages.save` fields with the hooks' edits of `content`, `metadata`, `silent`."""
        return await self._edit("before_update_message", updates, "metadata_", message_id=str(row.id))

    async def _edit(
        self,
        name: str,
        fields: dict[str, Any],
        metadata_key: str,
        *,
        drop: tuple[str, ...] = (),
        message_id: str | None = None,
    ) -> dict[str, Any]:
        """`fields` with the editable values the hooks changed (the engine's own fields stay as they were)."""
        if name not in self._by_name:
            return {k: v for k, v in fields.items() if k not in drop}
        shown = _shown(fields)
        args = () if message_id is None else (message_id,)
        edited = await self._chain(name, shown, *args, check=_editable)
        out = {k: v for k, v in fields.items() if k not in drop}
        for key in EDITABLE:
            if key in edited and edited[key] != shown[key]:
                out[metadata_key if key == "metadata" else key] = edited[key]
        return out

    async def after_update_message(self, row: tables.Message) -> None:
        await self._notify("after_update_message", row)

    async def after_tool_call(self, call: ToolCall, result: ToolResult) -> ToolResult | None:
        """`after_tool_call_success` or `_failure` by the result's status; `None` drops the call from history."""
        name = "after_tool_call_success" if result.status == "success" else "after_tool_call_failure"
        out: ToolResult | None = await self._chain(name, result, dict(call), check=_tool_result, none_ends=True)
        return out

    async def before_store_tool_result(self, call: ToolCall, result: ToolResult) -> ToolResult:
        out: ToolResult = await self._chain("before_store_tool_result", result, dict(call), check=_tool_result)
        return out

    async def tool_result(self, call: ToolCall, result: ToolResult) -> ToolResult | None:
        """`after_tool_call_*`, then `before_store_tool_result`: the result to store, or `None` (dropped)."""
        kept = await self.after_tool_call(call, result)
        return None if kept is None else await self.before_store_tool_result(call, kept)

    async def _chain(
        self, name: str, value: Any, *args: Any, check: Callable[[Any], Any], none_ends: bool = False
    ) -> Any:
        """Run the hooks called `name` in order, each on the previous one's output."""
        ran: list[Ran] = []
        for hook in self._by_name.get(name, ()):
            running = _running.set(name)
            try:
                with tracing.span(f"hook {name}", _traced(hook)) as span:
                    try:
                        started = time.perf_counter()
                        out = await hook.fn(self._state, *copy.deepcopy(args), copy.deepcopy(value))
                        if out is None and none_ends:
                            ran.append(Ran(name, hook.name, _since(started)))
                            value = None
                            break
                        value = check(out)
                        ran.append(Ran(name, hook.name, _since(started)))
                    except Exception as exc:
                        tracing.failed(span, type(exc).__name__)
                        await self._failed(hook, exc)
            finally:
                _running.reset(running)
        if ran:
            await self._record(ran)
        return value

    async def _notify(self, name: str, row: tables.Message) -> None:
        ran: list[Ran] = []
        for hook in self._by_name.get(name, ()):
            running = _running.set(name)
            try:
                with tracing.span(f"hook {name}", _traced(hook)) as span:
                    try:
                        started = time.perf_counter()
                        await hook.fn(self._state, StateMessage.model_validate(messages.to_dict(row)))
                        ran.append(Ran(name, hook.name, _since(started)))
                    except Exception as exc:
                        tracing.failed(span, type(exc).__name__)
                        await self._failed(hook, exc)
            finally:
                _running.reset(running)
        if ran:
            await self._record(ran)

    async def _record(self, ran: list[Ran]) -> None:
        """Log the hooks of one hook point that returned: with the next statement of the transaction they joined,
        else with what the caller writes next (`kept`), else in a transaction of their own."""
        if isinstance(self._transaction, Joined):
            for one in ran:
                await logs.add(self._transaction.session, one.row(self._transaction.thread.id))
            return
        keeping = _kept.get()
        if keeping is not None:
            keeping.extend(ran)
            return
        assert self._transaction is not None
        async with self._transaction() as (session, thread):
            for one in ran:
                await logs.add(session, one.row(thread.id))

    async def _failed(self, hook: HookDefinition, exc: Exception) -> None:
        """Log a hook that raised: its input goes on unchanged."""
        text = f"{type(exc).__name__}: {exc}"
        text = masking.scrub(text, self._secrets)
        assert self._transaction is not None
        async with self._transaction() as (session, thread):
            log.warning(
                "thread %s: hook `%s` (%s) failed, its input is used unchanged: %s",
                thread.id, hook.name, hook.hook, text,
            )  # fmt: skip
            await logs.add(session, logs.hook_error(thread.id, hook=hook.hook, name=hook.name, text=text))


def _since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)


def _traced(hook: HookDefinition) -> dict[str, str]:
    """A hook's span attributes: which hook of which kind (never what it was given)."""
    return {"agents.hook.name": hook.name, "agents.hook.type": hook.hook}


def _state_messages(value: Any) -> list[StateMessage]:
    if not isinstance(value, list):
        raise BadReturn(f"must return a list of messages, not {type(value).__name__}")
    return [m if isinstance(m, StateMessage) else StateMessage.model_validate(m) for m in value]


def _llm_messages(value: Any) -> list[LLMMessage]:
    if not isinstance(value, list) or not all(isinstance(m, LLMMessage) for m in value):
        raise BadReturn("must return a list of LLMMessage")
    return value


def _tool_result(value: Any) -> ToolResult:
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, dict):
        return ToolResult.model_validate(value)
    raise BadReturn(f"must return a ToolResult, not {type(value).__name__}")


def _editable(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReturn(f"must return a dict, not {type(value).__name__}")
    for key, kinds in EDITABLE.items():
        if key in value and not isinstance(value[key], kinds):
            raise BadReturn(f"`{key}` must be {' or '.join(t.__name__ for t in kinds)}")
    return value


def _shown(fields: dict[str, Any]) -> dict[str, Any]:
    """A message's fields as hooks see them: public names, plain values."""
    shown: dict[str, Any] = {"content": None, "metadata": {}, "silent": False}
    for key, value in fields.items():
        key = "metadata" if key == "metadata_" else key
        if key == "metadata" and value is None:
            value = {}
        if key in _SHOWN or key in EDITABLE or key in ("tool_calls", "reasoning_content", "usage"):
            shown[key] = str(value) if isinstance(value, uuid.UUID) else value
    return shown


def _row(message: StateMessage, original: tables.Message | None, before: tables.Message | None) -> tables.Message:
    """A detached row carrying a hook's message, for assembly (never added to a session)."""
    source = original or before
    values = {a.key: getattr(source, a.key) for a in inspect(tables.Message).column_attrs} if source else {}
    values.update(
        role=message.role,
        side=message.side,
        content=message.content,
        name=message.name,
        tool_calls=message.tool_calls,
        tool_call_id=message.tool_call_id,
        tool_status=message.tool_status,
        status=message.status,
        silent=message.silent,
        depth=message.depth,
        metadata_=message.metadata,
        created_at=message.created_at,
    )
    if original is None:
        values.update(
            id=uuid.uuid4(), attachments=[], reasoning_content=None, position=before.position if before else 0
        )
    return tables.Message(**values)
