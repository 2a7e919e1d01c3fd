"""`ThreadState` as a running execution gives it to tools (`semantics.md` §12, §7.4)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from cryptography.fernet import Fernet
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import attachments as attachment_store
from app import db, errors, events, files, lifecycle, messages, queue, tables, threads
from app import effects as effect_store
from app import env as env_store
from app import subagents as child_registry
from app.catalog import Catalog
from app.engine import handoffs, tools
from app.engine.context import Env, offered_tools
from app.engine.files import FileMethods
from app.settings import DEFAULT_TOOL_TIMEOUT
from app.spec.define import EffectDefinition
from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, ToolEntry
from app.spec.messages import ToolCall
from app.spec.results import ToolAttachment, ToolResult
from app.spec.state import (
    AttachmentRef,
    ExecutionState,
    MessagesResult,
    ScheduledEffect,
    StateLog,
    StateMessage,
    SubagentEntry,
)

if TYPE_CHECKING:  # subprompts.py builds states itself
    from app.engine.subprompts import Runner

Transaction = Callable[[], AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]]
INJECT_ROLES = ("user", "assistant", "system")
QUEUE_ROLES = ("user", "assistant")


class RunState(FileMethods):
    """The state of one thread; inside its own execution every write is fenced by the lease.

    `transaction` opens a transaction on the locked thread row. `queue_call` (given during a tool call) adds a
    tool call to the running step's list of calls still to run. `subprompts` (given inside an execution) runs
    subprompt steps.
    """

    def __init__(
        self,
        thread: tables.Thread,
        env: Env,
        transaction: Transaction,
        execution: ExecutionState | None,
        context: dict[str, Any],
        tool_env: dict[str, str] | None = None,
        *,
        catalog: Catalog,
        fernet: Fernet,
        queue_call: Callable[[ToolCall], None] | None = None,
        sessions: async_sessionmaker[AsyncSession] | None = None,
        children: list[SubagentEntry] | None = None,
        subprompts: Runner | None = None,
        tool_timeout: float = DEFAULT_TOOL_TIMEOUT,
    ) -> None:
        self.tool_timeout = tool_timeout  # seconds a tool call run through this state may take
        self._thread = thread
        self._env = env
        self._transaction = transaction
        self._execution = execution
        self._context = context
        self._tool_env = tool_env
        self._catalog = catalog
        self._fernet = fernet
        self._queue_call = queue_call
        self._sessions = sessions
        self._children = children or []
        self._subprompts = subprompts

    # -- identity ------------------------------------------------------------------------------------------

    @property
    def thread_id(self) -> str:
        return str(self._thread.id)

    @property
    def agent_id(self) -> str:
        return self._thread.agent

    @property
    def user_id(self) -> str:
        return self._thread.user_id

    @property
    def created_at(self) -> datetime:
        return self._thread.created_at

    @property
    def children(self) -> list[SubagentEntry]:
        return list(self._children)

    @property
    def terminated(self) -> datetime | None:
        return self._thread.terminated_at

    @property
    def execution(self) -> ExecutionState | None:
        return self._execution

    @property
    def context(self) -> dict[str, Any]:
        return self._context

    def _own(self, method: str) -> None:
        """Refuse a write that would race the running step (§12)."""
        if self._execution is None:
            raise errors.OutsideExecution(
                f"`state.{method}` is only allowed inside the thread's own execution (it would race the running step)"
            )

    # -- messages ------------------------------------------------------------------------------------------

    async def get_messages(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
        include_silent: bool = False,
        max_depth: int = 0,
    ) -> MessagesResult:
        _check_page(limit, offset)
        async with self._transaction() as (session, thread):
            cond = [tables.Message.thread_id == thread.id, tables.Message.depth <= max_depth]
            if not include_silent:
                cond.append(tables.Message.silent.is_(False))
            total = int((await session.execute(select(func.count()).where(*cond))).scalar_one())
            position = tables.Message.position
            query = (
                select(tables.Message)
                .where(*cond)
                .order_by(position.asc() if order == "asc" else position.desc())
                .offset(offset)
                .limit(limit)
            )
            rows = list((await session.execute(query)).scalars())
            extra = await _projections(session, thread.id, rows)
        return MessagesResult(
            messages=[_message(r, extra) for r in rows],
            total=total,
            has_more=offset + len(rows) < total,
        )

    async def get_message(self, message_id: str) -> StateMessage | None:
        key = _uuid(message_id)
        if key is None:
            return None
        async with self._transaction() as (session, thread):
            try:
                row = await messages.get(session, thread.id, key)
            except errors.MessageNotFound:
                return None
            return _message(row, await _projections(session, thread.id, [row]))

    async def inject_message(
        self,
        role: Literal["user", "assistant", "system"],
        content: str,
        *,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> StateMessage:
        self._own("inject_message")
        _check_input(role, INJECT_ROLES, content, metadata)
        from app.engine import hooks  # it builds on this module

        execution = self._execution
        assert execution is not None
        hook_runner = None
        if not hooks.creating():  # a create-message hook's own injections run no hooks: they would recurse
            side = self._catalog.agent(self._thread.agent).side(execution.side)
            assert side is not None, f"agent {self._thread.agent} has no side {execution.side}"
            prompt = self._catalog.prompts[side.prompt]  # the acting side's hooks, as for the engine's messages
            hook_runner = hooks.bind(
                self._catalog,
                self._fernet,
                self._thread,
                prompt,
                self._env,
                execution,
                self._transaction,
                self._context,
            )
        fields: dict[str, Any] = {"content": content, "silent": silent, "metadata_": metadata or {}}
        if hook_runner is not None:
            fields = await hook_runner.before_create_message(role, fields)
        async with self._transaction() as (session, thread):
            row = await messages.add(session, thread.id, role, session_number=thread.session_number, **fields)
            thread.last_message_at = row.created_at
        if hook_runner is not None:
            await hook_runner.after_create_message(row)
        return _message(row)

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
        self._own("update_message")
        _refuse_nul(content, metadata)
        key = _uuid(message_id)
        if key is None:
            raise errors.MessageNotFound(f"Message {message_id} not found")
        fields: dict[str, Any] = {}
        if content is not None:
            fields["content"] = content
        if metadata is not None:
            fields["metadata_"] = metadata
        async with self._transaction() as (session, thread):
            row = await messages.save(session, await messages.get(session, thread.id, key), **fields)
            return _message(row, await _projections(session, thread.id, [row]))

    async def delete_message(self, message_id: str) -> bool:
        self._own("delete_message")
        key = _uuid(message_id)
        if key is None:
            return False
        async with self._transaction() as (session, thread):
            return bool(await messages.remove(session, thread.id, key))

    # -- logs ----------------------------------------------------------------------------------------------

    async def get_logs(
        self, *, limit: int = 100, offset: int = 0, order: Literal["asc", "desc"] = "asc"
    ) -> list[StateLog]:
        _check_page(limit, offset)
        log = tables.Log
        keys = (log.created_at, log.id) if order == "asc" else (log.created_at.desc(), log.id.desc())
        async with self._transaction() as (session, thread):
            query = select(log).where(log.thread_id == thread.id).order_by(*keys).offset(offset).limit(limit)
            rows = list((await session.execute(query)).scalars())
        return [_log(r) for r in rows]

    # -- definitions ---------------------------------------------------------------------------------------

    async def load_model(self, name: str) -> ModelDefinition | None:
        return self._catalog.models.get(name)

    async def load_prompt(self, name: str) -> PromptDefinition | None:
        return self._catalog.prompts.get(name)

    async def load_agent(self, name: str) -> AgentDefinition | None:
        return self._catalog.agents.get(name)

    def get_model_names(self) -> list[str]:
        return sorted(self._catalog.models)

    def get_prompt_names(self) -> list[str]:
        return sorted(self._catalog.prompts)

    def get_agent_names(self) -> list[str]:
        return sorted(self._catalog.agents)

    def get_tool_names(self) -> list[str]:
        return sorted(self._catalog.tools)

    # -- variables -----------------------------------------------------------------------------------------

    async def env(self, name: str) -> str:
        return self._env.get(name, self._tool_env)

    async def set_env(self, name: str, value: str) -> None:
        self._own("set_env")
        if not isinstance(name, str) or not isinstance(value, str):
            raise errors.Invalid("`state.set_env` takes a variable name and a string value")
        env_store.check_name(name)
        _refuse_nul(name, value)
        declared = self._catalog.secret_names(self.agent_id)
        async with self._transaction() as (session, thread):
            secret = name in declared or (await env_store.thread_types(session, thread.id)).get(name) == "secret"
            await env_store.set_thread(session, self._fernet, thread.id, {name: value}, {name} if secret else set())
            if thread.has_children:  # live descendants see it from their next step on (§8)
                scoped_in = [a for a in self._catalog.agents if self._scoped(a, name)]
                await env_store.propagate(session, thread.id, name, scoped_in)
        # the step's resolver is shared by its tool calls: later `env` calls of this step see the value
        self._env.thread[name] = env_store.Value(value, "secret" if secret else "text")

    def _scoped(self, agent: str, name: str) -> bool:
        """Whether the agent's graph declares `name` scoped (its threads do not inherit it, as at creation, §6.7)."""
        return any(v.name == name and v.scoped for v in self._catalog.variables_of_agent(agent))

    # -- tools ---------------------------------------------------------------------------------------------

    async def invoke_tool(self, name: str, args: dict[str, Any] | None = None) -> ToolResult:
        definition = self._catalog.tools.get(name)
        if definition is None:
            kind = self._catalog.kind_of(name)
            if kind == "prompt":  # no tool message is stored for the call itself (§7.4)
                return await self.run_subprompt(ToolEntry(name=name), dict(args or {}))
            if kind == "agent":
                text = f"`{name}` is an agent: subagents and handoffs cannot be run with `invoke_tool`"
            else:
                text = f"Unknown tool `{name}`. Available tools: {', '.join(self.get_tool_names()) or 'none'}"
            return ToolResult(status="error", error=text)
        # the invoked tool runs inside the caller's execution and tool call, without a tool config
        state = self._derive(self._execution, None)
        return await tools.run(name, definition, dict(args or {}), state)

    async def run_subprompt(self, entry: ToolEntry, arguments: dict[str, Any]) -> ToolResult:
        """One step of the prompt `entry.name` in this thread, as its tool result (§7.2)."""
        if self._subprompts is None or self._execution is None:
            text = f"`{entry.name}` is a prompt: subprompts run only in a tool call of the thread's own execution"
            return ToolResult(status="error", error=text)
        return await self._subprompts.run(self, entry, arguments)

    async def hand_off(self, agent: str) -> ToolResult:
        """Hand the thread to `agent`, as a handoff tool call does (§7.3)."""
        async with self._transaction() as (session, thread):
            return await handoffs.switch(session, thread, self._catalog, agent)

    async def run_agent(self, name: str) -> None:
        self._own("run_agent")
        if not isinstance(name, str):
            raise errors.Invalid("`state.run_agent` takes an agent's name")
        self._catalog.agent(name)  # an unknown name: `Agent ... does not exist`
        result = await self.hand_off(name)
        if result.status == "error":
            raise errors.Invalid(f"`state.run_agent`: {result.error}")

    async def queue_tool(self, name: str, args: dict[str, Any] | None = None) -> str:
        if args is not None and not isinstance(args, dict):
            raise errors.Invalid("`state.queue_tool`: the arguments must be a dict")
        _refuse_nul(name, args)
        try:
            arguments = json.dumps(args or {})
        except (TypeError, ValueError) as exc:
            raise errors.Invalid(f"`state.queue_tool`: the arguments must be JSON: {exc}") from exc
        call: ToolCall = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        execution = self._execution
        async with self._transaction() as (session, thread):
            side = execution.side if execution is not None else (thread.side or "a")
            self._check_offered(thread, side, name)
            owner = None
            if execution is not None and execution.tool_call_id is not None and self._queue_call is not None:
                owner = await _calling_message(session, thread.id, execution.tool_call_id)
            if owner is None:  # not inside a tool call: a queued call the engine delivers as the side's own (§7.4)
                if thread.terminated_at is not None:
                    raise errors.ThreadTerminated()
                await queue.enqueue(session, thread.id, queue.Kind.TOOL, {"call": call})
                if thread.status == "idle":
                    await threads.set_status(session, thread, "queued")
                return call["id"]
            # the call joins the running step, paired in history with the message that made the running call
            await messages.save(session, owner, tool_calls=[*(owner.tool_calls or []), call])
        assert self._queue_call is not None
        self._queue_call(call)
        return call["id"]

    def _check_offered(self, thread: tables.Thread, side: str, name: str) -> None:
        """A queued call runs like the model's own, so it must name a tool the acting side is offered."""
        agent = self._catalog.agent(thread.agent)
        config = agent.side(side)  # type: ignore[arg-type]
        offered = set()
        if config is not None:
            prompt = self._catalog.prompts[config.prompt]
            # with the env: an `optional` subagent the side is offered is one it may queue (§6.6)
            offered = {t.name for t in offered_tools(self._catalog, prompt, config, self._env)}
        if name not in offered:
            known = ", ".join(sorted(offered)) or "none"
            raise errors.Invalid(f"`state.queue_tool`: side {side} is not offered a tool `{name}` (offered: {known})")

    # -- events --------------------------------------------------------------------------------------------

    async def emit(self, event: str, data: Any) -> None:
        payload = self._env.mask({"event_type": event, "data": data})  # a tool may echo a secret: never in events
        async with self._transaction() as (session, thread):
            await events.append(session, thread.id, "event", payload)

    # -- subagents ----------------------------------------------------------------------------------------

    async def notify_parent(self, content: str) -> None:
        if not isinstance(content, str) or not content:
            raise errors.Invalid("`state.notify_parent` takes a non-empty string")
        _refuse_nul(content)
        content = self._env.mask(content)
        async with self._transaction() as (session, thread):
            await child_registry.notify_parent(session, thread, content)

    async def set_status(self, text: str) -> None:
        if not isinstance(text, str) or not text or len(text) > 1000:
            raise errors.Invalid("`state.set_status` takes a string of 1 to 1000 characters")
        _refuse_nul(text)
        async with self._transaction() as (session, thread):
            if thread.parent_id is None:
                raise errors.Invalid("`state.set_status` is for subagents: this thread has no parent")
            thread.status_text = self._env.mask(text)
            data = {"status": thread.status, "status_text": thread.status_text}
            await events.append(session, thread.id, "thread_status", data)
            await child_registry.announce(session, thread)

    async def get_child_thread(self, reference: str) -> RunState | None:
        key = _uuid(reference)
        if key is None:
            return None
        async with self._transaction() as (session, thread):
            child = await session.get(tables.Thread, key)
            if child is None or child.parent_id != thread.id:
                return None
        return await self._other(key)

    async def get_parent_thread(self) -> RunState | None:
        parent = self._thread.parent_id
        return None if parent is None else await self._other(parent)

    async def _other(self, thread_id: uuid.UUID) -> RunState:
        if self._sessions is None:
            raise errors.OutsideExecution("handles on other threads are not available here")
        from app.engine import outside  # it builds on this module

        return await outside.state(self._sessions, self._catalog, self._fernet, thread_id)

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def terminate(self) -> None:
        async with self._transaction() as (session, thread):
            await lifecycle.terminate(session, thread)

    # -- effects -------------------------------------------------------------------------------------------

    async def schedule_effect(self, name: str, args: dict[str, Any] | None = None, delay_ms: float = 0) -> str:
        definition = self._catalog.effects.get(name)
        if definition is None:
            known = ", ".join(sorted(self._catalog.effects)) or "none"
            raise errors.UnknownEffect(f"Unknown effect `{name}`. Defined effects: {known}")
        args = {} if args is None else args
        problem = effect_args_problem(definition, args)
        if problem is not None:
            raise errors.Invalid(f"`state.schedule_effect`: {problem}")
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int | float) or not 0 <= delay_ms <= MAX_DELAY_MS:
            raise errors.Invalid("`state.schedule_effect`: `delay_ms` must be a number of milliseconds, 0 to 10 years")
        async with self._transaction() as (session, thread):
            if thread.terminated_at is not None:
                raise errors.ThreadTerminated()
            row = await effect_store.schedule(session, thread.id, name, args, delay_ms)
        return str(row.id)

    async def get_scheduled_effects(self, name: str | None = None) -> list[ScheduledEffect]:
        async with self._transaction() as (session, thread):
            rows = await effect_store.list_(session, thread.id, name=name, pending=True)
        return [scheduled_effect(r) for r in rows]

    async def remove_scheduled_effect(self, effect_id: str) -> bool:
        key = _uuid(effect_id)
        if key is None:
            return False
        async with self._transaction() as (session, thread):
            try:
                return await effect_store.cancel(session, thread.id, key)
            except (errors.EffectNotFound, errors.EffectNotCancellable):
                return False

    # -- derived states ------------------------------------------------------------------------------------

    def with_tool(self, tool_call_id: str, options: dict[str, Any], tool_env: dict[str, str]) -> RunState:
        """The state a tool call sees: its call id, options and config env."""
        assert self._execution is not None
        execution = ExecutionState(
            side=self._execution.side,
            step=self._execution.step,
            session=self._execution.session,
            attempt=self._execution.attempt,
            tool_call_id=tool_call_id,
            tool_options=options,
        )
        return self._derive(execution, tool_env)

    def _derive(self, execution: ExecutionState | None, tool_env: dict[str, str] | None) -> RunState:
        return RunState(
            self._thread,
            self._env,
            self._transaction,
            execution,
            self._context,
            tool_env,
            catalog=self._catalog,
            fernet=self._fernet,
            queue_call=self._queue_call,
            sessions=self._sessions,
            children=self._children,
            subprompts=self._subprompts,
            tool_timeout=self.tool_timeout,
        )


async def deliver_tool(session: AsyncSession, thread: tables.Thread, payload: dict[str, Any]) -> tables.Message:
    """Store a queued tool call (`queue.Kind.TOOL`) as the acting side's own call; the step loop then runs it."""
    return await messages.add(
        session,
        thread.id,
        "assistant",
        side=thread.side or "a",
        tool_calls=[payload["call"]],
        session_number=thread.session_number,
    )


async def _calling_message(session: AsyncSession, thread_id: uuid.UUID, tool_call_id: str) -> tables.Message | None:
    """The assistant message holding the tool call `tool_call_id`."""
    query = (
        select(tables.Message)
        .where(
            tables.Message.thread_id == thread_id,
            tables.Message.role == "assistant",
            tables.Message.tool_calls.contains([{"id": tool_call_id}]),
        )
        .order_by(tables.Message.position.desc())
        .limit(1)
    )
    return (await session.execute(query)).scalar_one_or_none()


# -- effects ---------------------------------------------------------------------------------------------------

MAX_DELAY_MS = 10 * 366 * 86_400_000


def effect_args_problem(definition: EffectDefinition, args: Any) -> str | None:
    """What is wrong with an effect's arguments (JSON, then its argument model), or None."""
    if not isinstance(args, dict):
        return "the arguments must be a dict"
    try:
        _refuse_nul(args)
        json.dumps(args, allow_nan=False)
    except (errors.Invalid, TypeError, ValueError) as exc:
        return f"the arguments must be JSON: {exc}"
    if definition.args_model is None:
        return None
    try:
        definition.args_model.model_validate(args)
    except ValidationError as exc:
        return f"invalid arguments for effect `{definition.name}`: {tools.problems(exc)}"
    return None


def scheduled_effect(row: tables.Effect) -> ScheduledEffect:
    return ScheduledEffect(
        id=str(row.id),
        name=row.name,
        args=row.args,
        run_at=row.run_at,
        status=row.status,
        attempts=row.attempts,
        created_at=row.created_at,
    )


def _message(row: tables.Message, projected: dict[uuid.UUID, dict[str, Any]] | None = None) -> StateMessage:
    extra = (projected or {}).get(row.subagent_id) if row.subagent_id is not None else None
    return StateMessage.model_validate({**messages.to_dict(row), **(extra or {})})


async def _projections(
    session: AsyncSession, thread_id: uuid.UUID, rows: list[tables.Message]
) -> dict[uuid.UUID, dict[str, Any]]:
    """The `subagent_*` fields of the rows that speak for a child (a query only when one does)."""
    return await child_registry.projections(session, thread_id, {r.subagent_id for r in rows if r.subagent_id})


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
    _refuse_nul(*(a.model_dump() for a in out))
    return out


async def _attachment(
    session: AsyncSession, thread_id: uuid.UUID, item: ToolAttachment | AttachmentRef
) -> dict[str, Any]:
    """A message's reference to the attachment: a new file is stored under `/attachments/` (code's own output is
    not refused for its size, as a tool's is not); a path must name a file of the thread."""
    if isinstance(item, ToolAttachment):
        data = attachment_store.decode(item.data, item.name)
        limit = max(files.DEFAULT_LIMIT, len(data))
        return await attachment_store.store(session, thread_id, item.name, data, item.mime_type, limit)
    try:
        entry = await files.stat(session, thread_id, item.path)
    except errors.FileNotFound:
        entry = None
    if entry is None or entry.is_dir:
        raise errors.FileNotFound(f"Attachment not found: {item.path}", path=item.path)
    return attachment_store.reference(entry, item.name)


def _log(row: tables.Log) -> StateLog:
    fields = {name: getattr(row, name) for name in StateLog.model_fields}
    ids = {"id": str(row.id), "message_id": str(row.message_id) if row.message_id else None}
    return StateLog.model_validate(fields | ids)


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise errors.Invalid("`limit` and `offset` must not be negative")


def _check_input(role: str, roles: tuple[str, ...], content: Any, metadata: Any) -> None:
    if role not in roles:
        raise errors.Invalid(f"`role` must be one of {', '.join(roles)}, not {role!r}")
    if not isinstance(content, str):
        raise errors.Invalid("`content` must be a string")
    if metadata is not None and not isinstance(metadata, dict):
        raise errors.Invalid("`metadata` must be a dict")
    _refuse_nul(content, metadata)


def _refuse_nul(*values: Any) -> None:
    """Postgres cannot store NUL characters; refuse them before they reach the driver."""
    if db.has_nul(list(values)):
        raise errors.Invalid(db.NUL_REFUSED)
