"""`ThreadState` as the engine gives it to tools, hooks, effects and code outside the thread's execution
(`semantics.md` §12, §7.4), and the one way each is made (`Shared.state`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, Literal, Protocol

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import (
    children,
    control,
    errors,
    event_types,
    events,
    logs,
    tables,
    threads,
)
from app.catalog import Catalog
from app.engine import handoffs, hooks, tool_queue, tools, types
from app.engine.context import load_env
from app.engine.files import Files
from app.engine.messages import Messages, as_uuid, check_page, own, refuse_nul
from app.engine.schedule import Schedule
from app.engine.variables import Variables
from app.settings import DEFAULT_TOOL_TIMEOUT
from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, Side, ToolEntry
from app.spec.messages import ToolCall
from app.spec.results import ToolAttachment, ToolResult
from app.spec.state import (
    AttachmentRef,
    ExecutionState,
    FileRecord,
    FileStats,
    FindResult,
    GrepMatch,
    MessagesResult,
    ReaddirResult,
    ScheduledEffect,
    StateLog,
    StateMessage,
    SubagentEntry,
)


class Subprompts(Protocol):
    """What runs a subprompt's step for a tool call (`subprompts.Runner`, which builds on this module)."""

    async def run(self, state: RunState, entry: ToolEntry, arguments: dict[str, Any]) -> ToolResult: ...


@dataclass(frozen=True)
class Shared:
    """What the states of one thread at one point of its run share; a `RunState` is this, its execution and its
    tool's config env, and `state()` is the one place one is made. The states a state derives (`with_tool`,
    `in_subprompt`, `hooks_of`) share it, changed only where their docstrings say.

    `transaction` opens a transaction on the locked thread row (fenced by the lease inside an execution).
    `context` is `state.context`, one dict per execution. `sessions` (not for hooks) opens handles on other threads.
    `subprompts` (given to a step's tool calls) runs subprompt steps. `children` is the registry as the state was
    made. `queue_call` (given to a step's tool calls) adds a tool call to the step's calls still to run.
    """

    thread: tables.Thread
    env: types.Env
    transaction: types.Transaction
    _: KW_ONLY
    catalog: Catalog
    fernet: Fernet
    context: dict[str, Any] = field(default_factory=dict)
    sessions: async_sessionmaker[AsyncSession] | None = None
    subprompts: Subprompts | None = None
    children: tuple[SubagentEntry, ...] = ()
    queue_call: Callable[[ToolCall], None] | None = None
    partial: types.Partial | None = None  # (with `subprompts`) stores a subprompt's streaming text so far
    tool_timeout: float = DEFAULT_TOOL_TIMEOUT  # seconds a tool call run through the state may take

    def state(self, execution: ExecutionState | None = None, tool_env: dict[str, str] | None = None) -> RunState:
        """The state of `execution` (None: outside the thread's execution), a tool's config env `tool_env` given."""
        return RunState(self, execution, tool_env)


class RunState:
    """The state of one thread (`ThreadState`); inside its own execution every write is fenced by the lease.

    Made by `Shared.state` (and the factories below it: `outside`, `prepare_hooks`). Its file methods are those of
    `Files` (`engine/files.py`), its message methods those of `Messages` (`engine/messages.py`), its effect methods
    those of `Schedule` (`engine/schedule.py`) and its variable methods those of `Variables` (`engine/variables.py`),
    all over its transaction.
    """

    def __init__(self, shared: Shared, execution: ExecutionState | None, tool_env: dict[str, str] | None) -> None:
        self._shared = shared
        self._execution = execution
        self._tool_env = tool_env
        self._files = Files(shared.transaction)
        # the hooks over `shared` and `execution`, not over this state: a bound method would make the state and its
        # `Messages` a reference cycle, left for the collector's full passes (issue 36)
        self._messages = Messages(
            shared.transaction, execution, partial(_acting_hooks, shared, execution), shared.context
        )
        self._schedule = Schedule(shared.transaction, shared.catalog)
        self._variables = Variables(
            shared.transaction, shared.catalog, shared.fernet, shared.env, shared.thread.agent, execution
        )

    @property
    def shared(self) -> Shared:
        return self._shared

    @property
    def tool_timeout(self) -> float:
        return self._shared.tool_timeout

    # -- identity ------------------------------------------------------------------------------------------

    @property
    def thread_id(self) -> str:
        return str(self._shared.thread.id)

    @property
    def agent_id(self) -> str:
        return self._shared.thread.agent

    @property
    def user_id(self) -> str:
        return self._shared.thread.user_id

    @property
    def created_at(self) -> datetime:
        return self._shared.thread.created_at

    @property
    def children(self) -> list[SubagentEntry]:
        return list(self._shared.children)

    @property
    def terminated(self) -> datetime | None:
        return self._shared.thread.terminated_at

    @property
    def execution(self) -> ExecutionState | None:
        return self._execution

    @property
    def context(self) -> dict[str, Any]:
        return self._shared.context

    # -- messages: `Messages` (`engine/messages.py`) -------------------------------------------------------------

    async def get_messages(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
        include_silent: bool = False,
        max_depth: int = 0,
    ) -> MessagesResult:
        return await self._messages.get_messages(
            limit=limit, offset=offset, order=order, include_silent=include_silent, max_depth=max_depth
        )

    async def get_message(self, message_id: str) -> StateMessage | None:
        return await self._messages.get_message(message_id)

    async def inject_message(
        self,
        role: Literal["user", "assistant", "system"],
        content: str,
        *,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> StateMessage:
        return await self._messages.inject_message(role, content, silent=silent, metadata=metadata)

    async def queue_message(
        self,
        role: Literal["user", "assistant"],
        content: str,
        *,
        attachments: Sequence[ToolAttachment | AttachmentRef | str] | None = None,
        silent: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        return await self._messages.queue_message(
            role, content, attachments=attachments, silent=silent, metadata=metadata
        )

    async def update_message(
        self, message_id: str, *, content: str | None = None, metadata: dict[str, Any] | None = None
    ) -> StateMessage:
        return await self._messages.update_message(message_id, content=content, metadata=metadata)

    async def delete_message(self, message_id: str) -> bool:
        return await self._messages.delete_message(message_id)

    # -- files: `Files` (`engine/files.py`) ---------------------------------------------------------------------

    async def write_file(self, path: str, data: bytes | str, mime_type: str | None = None) -> FileRecord:
        return await self._files.write_file(path, data, mime_type)

    async def read_file(self, path: str) -> bytes | None:
        return await self._files.read_file(path)

    async def read_file_stream(self, path: str) -> AsyncIterator[bytes] | None:
        return await self._files.read_file_stream(path)

    async def stat_file(self, path: str) -> FileRecord | None:
        return await self._files.stat_file(path)

    async def readdir_file(self, path: str = "/") -> ReaddirResult:
        return await self._files.readdir_file(path)

    async def unlink_file(self, path: str) -> None:
        await self._files.unlink_file(path)

    async def mkdir_file(self, path: str) -> FileRecord:
        return await self._files.mkdir_file(path)

    async def rmdir_file(self, path: str) -> None:
        await self._files.rmdir_file(path)

    async def get_file_stats(self) -> FileStats:
        return await self._files.get_file_stats()

    async def grep_files(self, pattern: str) -> list[GrepMatch]:
        return await self._files.grep_files(pattern)

    async def find_files(self, pattern: str) -> FindResult:
        return await self._files.find_files(pattern)

    async def get_file_thumbnail(self, path: str) -> bytes | None:
        return await self._files.get_file_thumbnail(path)

    # -- logs ----------------------------------------------------------------------------------------------

    async def get_logs(
        self, *, limit: int = 100, offset: int = 0, order: Literal["asc", "desc"] = "asc"
    ) -> list[StateLog]:
        check_page(limit, offset)
        async with self._shared.transaction() as (session, thread):
            rows = await logs.window(session, thread.id, offset=offset, limit=limit, descending=order != "asc")
        return [_log(r) for r in rows]

    # -- definitions ---------------------------------------------------------------------------------------

    async def load_model(self, name: str) -> ModelDefinition | None:
        return self._shared.catalog.models.get(name)

    async def load_prompt(self, name: str) -> PromptDefinition | None:
        return self._shared.catalog.prompts.get(name)

    async def load_agent(self, name: str) -> AgentDefinition | None:
        return self._shared.catalog.agents.get(name)

    def get_model_names(self) -> list[str]:
        return sorted(self._shared.catalog.models)

    def get_prompt_names(self) -> list[str]:
        return sorted(self._shared.catalog.prompts)

    def get_agent_names(self) -> list[str]:
        return sorted(self._shared.catalog.agents)

    def get_tool_names(self) -> list[str]:
        return sorted(self._shared.catalog.tools)

    # -- variables: `Variables` (`engine/variables.py`) ---------------------------------------------------------

    async def env(self, name: str) -> str:
        return self._variables.get(name, self._tool_env)

    async def set_env(self, name: str, value: str) -> None:
        await self._variables.set(name, value)

    # -- tools ---------------------------------------------------------------------------------------------

    async def invoke_tool(self, name: str, args: dict[str, Any] | None = None) -> ToolResult:
        """Run a tool (or a subprompt) as a call inside the caller's; no message holds its result, but its `logs` row
        is a step's call's (`tools.log_row`: its arguments, duration and masked error)."""
        arguments = dict(args or {})
        call: ToolCall = {
            "id": f"call_{uuid.uuid4().hex[:24]}",  # its own: the model never saw this call
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, default=str)},
        }
        started = time.perf_counter()
        result = await self._invoke(name, arguments)
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        async with self._shared.transaction() as (session, thread):
            await logs.add(session, tools.log_row(thread.id, call, result, latency_ms, self._shared.env.secrets()))
        return result

    async def _invoke(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        definition = self._shared.catalog.tools.get(name)
        if definition is None:
            kind = self._shared.catalog.kind_of(name)
            if kind == "prompt":  # no tool message is stored for the call itself (§7.4)
                return await self.run_subprompt(ToolEntry(name=name), arguments)
            if kind == "agent":
                text = f"`{name}` is an agent: subagents and handoffs cannot be run with `invoke_tool`"
            else:
                text = f"Unknown tool `{name}`. Available tools: {', '.join(self.get_tool_names()) or 'none'}"
            return types.error(text)
        # the invoked tool runs inside the caller's execution and tool call, without a tool config
        return await tools.run(name, definition, arguments, self._shared.state(self._execution))

    async def run_subprompt(self, entry: ToolEntry, arguments: dict[str, Any]) -> ToolResult:
        """One step of the prompt `entry.name` in this thread, as its tool result (§7.2)."""
        if self._shared.subprompts is None or self._execution is None:
            text = f"`{entry.name}` is a prompt: subprompts run only in a tool call of the thread's own execution"
            return types.error(text)
        return await self._shared.subprompts.run(self, entry, arguments)

    async def hand_off(self, agent: str) -> ToolResult:
        """Hand the thread to `agent`, as a handoff tool call does (§7.3)."""
        async with self._shared.transaction() as (session, thread):
            return await handoffs.switch(session, thread, self._shared.catalog, agent)

    async def run_agent(self, name: str) -> None:
        own(self._execution, "run_agent")
        if not isinstance(name, str):
            raise errors.Invalid("`state.run_agent` takes an agent's name")
        self._shared.catalog.agent(name)  # an unknown name: `Agent ... does not exist`
        result = await self.hand_off(name)
        if result.status == "error":
            raise errors.Invalid(f"`state.run_agent`: {result.error}")

    async def queue_tool(self, name: str, args: dict[str, Any] | None = None) -> str:
        shared = self._shared
        execution, queue_call = self._execution, shared.queue_call
        return await tool_queue.queue_tool(
            shared.transaction, shared.catalog, shared.env, execution, queue_call, name, args
        )

    # -- events --------------------------------------------------------------------------------------------

    async def emit(self, event: str, data: Any) -> None:
        payload = self._shared.env.mask(
            {"event_type": event, "data": data}
        )  # a tool may echo a secret: never in events
        async with self._shared.transaction() as (session, thread):
            await events.append(session, thread.id, "event", payload)

    # -- subagents ----------------------------------------------------------------------------------------

    async def notify_parent(self, content: str) -> None:
        if not isinstance(content, str) or not content:
            raise errors.Invalid("`state.notify_parent` takes a non-empty string")
        refuse_nul(content)
        content = self._shared.env.mask(content)
        async with self._shared.transaction() as (session, thread):
            await children.notify_parent(session, thread, content)

    async def set_status(self, text: str) -> None:
        if not isinstance(text, str) or not text or len(text) > 1000:
            raise errors.Invalid("`state.set_status` takes a string of 1 to 1000 characters")
        refuse_nul(text)
        async with self._shared.transaction() as (session, thread):
            if thread.parent_id is None:
                raise errors.Invalid("`state.set_status` is for subagents: this thread has no parent")
            thread.status_text = self._shared.env.mask(text)
            data = event_types.ThreadStatus(status=thread.status, status_text=thread.status_text)
            await events.append(session, thread.id, "thread_status", data)
            await children.announce(session, thread)

    async def get_child_thread(self, reference: str) -> RunState | None:
        key = as_uuid(reference)
        if key is None:
            return None
        async with self._shared.transaction() as (session, thread):
            child = await session.get(tables.Thread, key)
            if child is None or child.parent_id != thread.id:
                return None
        return await self._other(key)

    async def get_parent_thread(self) -> RunState | None:
        parent = self._shared.thread.parent_id
        return None if parent is None else await self._other(parent)

    async def _other(self, thread_id: uuid.UUID) -> RunState:
        if self._shared.sessions is None:
            raise errors.OutsideExecution("handles on other threads are not available here")
        return await outside(self._shared.sessions, self._shared.catalog, self._shared.fernet, thread_id)

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def terminate(self) -> None:
        async with self._shared.transaction() as (session, thread):
            await control.terminate(session, thread)

    # -- effects: `Schedule` (`engine/schedule.py`) -----------------------------------------------------------

    async def schedule_effect(self, name: str, args: dict[str, Any] | None = None, delay_ms: float = 0) -> str:
        return await self._schedule.add(name, args, delay_ms)

    async def get_scheduled_effects(self, name: str | None = None) -> list[ScheduledEffect]:
        return await self._schedule.pending(name)

    async def remove_scheduled_effect(self, effect_id: str) -> bool:
        return await self._schedule.cancel(effect_id)

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
        return self._shared.state(execution, tool_env)

    def in_subprompt(self, prompt: PromptDefinition) -> RunState:
        """The state of a subprompt step run for this state's tool call: the subprompt's own `env` layer, and no
        calls joining the thread's step (a call it queues is delivered later, as the side's own)."""
        env = replace(self._shared.env, prompt=dict(prompt.env))
        return replace(self._shared, env=env, queue_call=None).state(self._execution)

    def hooks_of(self, prompt: PromptDefinition, transaction: types.Transaction | None = None) -> hooks.Hooks:
        """The hooks active for `prompt` (the acting side's, or a subprompt's own), bound to the state they get: this
        one running in `transaction` (default: this state's), without its tool's config env; a hook's state runs no
        subprompts, adds no calls to the step and opens no handles on other threads, whoever made it."""
        return _hooks_of(self._shared, self._execution, prompt, transaction)


def _hooks_of(
    shared: Shared, execution: ExecutionState | None, prompt: PromptDefinition, transaction: types.Transaction | None
) -> hooks.Hooks:
    """`RunState.hooks_of` of the state `shared.state(execution)`."""
    definitions = hooks.active(shared.catalog, shared.catalog.agent(shared.thread.agent), prompt)
    if not definitions:
        return hooks.Hooks()
    tx = transaction or shared.transaction
    shared = replace(shared, transaction=tx, sessions=None, subprompts=None, queue_call=None)
    return hooks.Hooks(definitions, shared.state(execution), shared.transaction, shared.env.secrets())


def _acting_hooks(shared: Shared, execution: ExecutionState | None, transaction: types.Transaction) -> hooks.Hooks:
    """The hooks of the acting side's prompt, as for the engine's own messages (for `Messages`)."""
    assert execution is not None, "only writes inside the execution run message hooks"
    agent = shared.catalog.agent(shared.thread.agent)
    side = agent.side(execution.side)
    assert side is not None, f"agent {agent.name} has no side {execution.side}"
    return _hooks_of(shared, execution, shared.catalog.prompts[side.prompt], transaction)


# -- the states made from outside a step -----------------------------------------------------------------------


async def outside(
    sessions: async_sessionmaker[AsyncSession], catalog: Catalog, fernet: Fernet, thread_id: uuid.UUID
) -> RunState:
    """The state of thread `thread_id` for code outside its execution (custom endpoints, handles on other threads):
    `execution` is `None`, `context` empty. Each call runs in a short transaction of its own that locks the thread
    row (no lease: the running step, if any, keeps its own); the writes only the thread's own execution may make
    are refused."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[tuple[AsyncSession, tables.Thread]]:
        async with sessions() as session, session.begin():
            yield session, await threads.lock(session, thread_id)

    async with transaction() as (session, thread):
        agent = catalog.agent(thread.agent)
        side = agent.side(thread.side or "a")  # the acting side's prompt, as the engine resolves it
        prompt = catalog.prompts[side.prompt] if side is not None else None
        env = await load_env(session, fernet, catalog, thread, prompt)
        registry = tuple(
            SubagentEntry.model_validate(children.entry(c)) for c in await children.listed(session, thread)
        )
    shared = Shared(thread, env, transaction, catalog=catalog, fernet=fernet, sessions=sessions, children=registry)
    return shared.state()


async def prepare_hooks(
    catalog: Catalog,
    fernet: Fernet,
    session: AsyncSession,
    thread: tables.Thread,
    side: Side,
    *,
    env: types.Env | None = None,
    transaction: types.Transaction | None = None,
    context: dict[str, Any] | None = None,
    outside: bool = False,
) -> hooks.Hooks:
    """The hooks of the side's prompt and the state they get; without `transaction` they join `session`'s.
    `outside`: run for a client (an HTTP edit), not inside the thread's execution: `state.execution` is `None`."""
    agent = catalog.agent(thread.agent)
    config = agent.side(side)
    assert config is not None, f"agent {agent.name} has no side {side}"
    prompt = catalog.prompts[config.prompt]
    if not hooks.active(catalog, agent, prompt):
        return hooks.Hooks()
    if env is None:
        env = await load_env(session, fernet, catalog, thread, prompt)
    execution = None
    if not outside:
        execution = ExecutionState(
            side=side,
            step=thread.session_steps,
            session=thread.session_number,
            attempt=thread.attempt,
        )
    tx = transaction or hooks.Joined(session, thread)
    shared = Shared(thread, env, tx, catalog=catalog, fernet=fernet, context={} if context is None else context)
    return shared.state(execution).hooks_of(prompt)


def _log(row: tables.Log) -> StateLog:
    fields = {name: getattr(row, name) for name in StateLog.model_fields}
    ids = {"id": str(row.id), "message_id": str(row.message_id) if row.message_id else None}
    return StateLog.model_validate(fields | ids)
