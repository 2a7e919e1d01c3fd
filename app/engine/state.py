"""`ThreadState` as a running execution gives it to tools (`semantics.md` §12, §7.4)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from cryptography.fernet import Fernet
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import (
    children,
    control,
    effects,
    environment,
    errors,
    event_types,
    events,
    inputs,
    logs,
    messages,
    queue,
    tables,
    threads,
)
from app.catalog import Catalog
from app.engine import handoffs, tool_arguments, tools, types
from app.engine.context import offered_tools
from app.engine.files import FileMethods
from app.engine.messages import MessageMethods, as_uuid, check_page, refuse_nul
from app.settings import DEFAULT_TOOL_TIMEOUT
from app.spec.define import EffectDefinition
from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, Side, ToolEntry
from app.spec.messages import ToolCall
from app.spec.results import ToolResult
from app.spec.state import (
    ExecutionState,
    ScheduledEffect,
    StateLog,
    SubagentEntry,
)

if TYPE_CHECKING:  # subprompts.py builds states itself
    from app.engine.subprompts import Runner


class RunState(FileMethods, MessageMethods):
    """The state of one thread; inside its own execution every write is fenced by the lease.

    `transaction` opens a transaction on the locked thread row. `queue_call` (given during a tool call) adds a
    tool call to the running step's list of calls still to run. `subprompts` (given inside an execution) runs
    subprompt steps.
    """

    def __init__(
        self,
        thread: tables.Thread,
        env: types.Env,
        transaction: types.Transaction,
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

    # -- logs ----------------------------------------------------------------------------------------------

    async def get_logs(
        self, *, limit: int = 100, offset: int = 0, order: Literal["asc", "desc"] = "asc"
    ) -> list[StateLog]:
        check_page(limit, offset)
        async with self._transaction() as (session, thread):
            rows = await logs.window(session, thread.id, offset=offset, limit=limit, descending=order != "asc")
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
        environment.check_name(name)
        refuse_nul(name, value)
        declared = self._catalog.secret_names(self.agent_id)
        async with self._transaction() as (session, thread):
            secret = name in declared or (await environment.thread_types(session, thread.id)).get(name) == "secret"
            await environment.set_thread(session, self._fernet, thread.id, {name: value}, {name} if secret else set())
            if thread.has_children:  # live descendants see it from their next step on (§8)
                scoped_in = [a for a in self._catalog.agents if self._scoped(a, name)]
                await environment.propagate(session, thread.id, name, scoped_in)
        # the step's resolver is shared by its tool calls: later `env` calls of this step see the value
        self._env.thread[name] = environment.Value(value, "secret" if secret else "text")

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
        refuse_nul(name, args)
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
                owner = await messages.holding(session, thread.id, execution.tool_call_id, role="assistant")
            if owner is None:  # not inside a tool call: a queued call the engine delivers as the side's own (§7.4)
                if thread.terminated_at is not None:
                    raise errors.ThreadTerminated()
                await queue.enqueue(session, thread.id, inputs.Kind.TOOL, {"call": call})
                if thread.status == threads.Status.IDLE:
                    await threads.set_status(session, thread, threads.Status.QUEUED)
                return call["id"]
            # the call joins the running step, paired in history with the message that made the running call
            await messages.save(session, owner, tool_calls=[*(owner.tool_calls or []), call])
        assert self._queue_call is not None
        self._queue_call(call)
        return call["id"]

    def _check_offered(self, thread: tables.Thread, side: Side, name: str) -> None:
        """A queued call runs like the model's own, so it must name a tool the acting side is offered."""
        agent = self._catalog.agent(thread.agent)
        config = agent.side(side)
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
        refuse_nul(content)
        content = self._env.mask(content)
        async with self._transaction() as (session, thread):
            await children.notify_parent(session, thread, content)

    async def set_status(self, text: str) -> None:
        if not isinstance(text, str) or not text or len(text) > 1000:
            raise errors.Invalid("`state.set_status` takes a string of 1 to 1000 characters")
        refuse_nul(text)
        async with self._transaction() as (session, thread):
            if thread.parent_id is None:
                raise errors.Invalid("`state.set_status` is for subagents: this thread has no parent")
            thread.status_text = self._env.mask(text)
            data = event_types.ThreadStatus(status=thread.status, status_text=thread.status_text)
            await events.append(session, thread.id, "thread_status", data)
            await children.announce(session, thread)

    async def get_child_thread(self, reference: str) -> RunState | None:
        key = as_uuid(reference)
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
            await control.terminate(session, thread)

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
            row = await effects.schedule(session, thread.id, name, args, delay_ms)
        return str(row.id)

    async def get_scheduled_effects(self, name: str | None = None) -> list[ScheduledEffect]:
        async with self._transaction() as (session, thread):
            rows = await effects.list_(session, thread.id, name=name, pending=True)
        return [scheduled_effect(r) for r in rows]

    async def remove_scheduled_effect(self, effect_id: str) -> bool:
        key = as_uuid(effect_id)
        if key is None:
            return False
        async with self._transaction() as (session, thread):
            try:
                return await effects.cancel(session, thread.id, key)
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


async def deliver_tool(session: AsyncSession, thread: tables.Thread, call: dict[str, Any]) -> tables.Message:
    """Store a queued tool call (`inputs.Kind.TOOL`) as the acting side's own call; the step loop then runs it."""
    return await messages.add(
        session,
        thread.id,
        "assistant",
        side=thread.side or "a",
        tool_calls=[call],
        session_number=thread.session_number,
    )


# -- effects ---------------------------------------------------------------------------------------------------

MAX_DELAY_MS = 10 * 366 * 86_400_000


def effect_args_problem(definition: EffectDefinition, args: Any) -> str | None:
    """What is wrong with an effect's arguments (JSON, then its argument model), or None."""
    if not isinstance(args, dict):
        return "the arguments must be a dict"
    try:
        refuse_nul(args)
        json.dumps(args, allow_nan=False)
    except (errors.Invalid, TypeError, ValueError) as exc:
        return f"the arguments must be JSON: {exc}"
    if definition.args_model is None:
        return None
    try:
        definition.args_model.model_validate(args)
    except ValidationError as exc:
        return f"invalid arguments for effect `{definition.name}`: {tool_arguments.problems(exc)}"
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


def _log(row: tables.Log) -> StateLog:
    fields = {name: getattr(row, name) for name in StateLog.model_fields}
    ids = {"id": str(row.id), "message_id": str(row.message_id) if row.message_id else None}
    return StateLog.model_validate(fields | ids)
