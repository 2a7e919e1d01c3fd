"""`ThreadState` as a running execution gives it to tools (`semantics.md` §12)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from app import events, messages, tables
from app.engine.context import Env
from app.spec.state import ExecutionState, MessagesResult, StateMessage

Transaction = Callable[[], AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]]


class RunState:
    """The state of one thread inside its own execution; every write is fenced by the lease."""

    def __init__(
        self,
        thread: tables.Thread,
        env: Env,
        transaction: Transaction,
        execution: ExecutionState | None,
        context: dict[str, Any],
        tool_env: dict[str, str] | None = None,
    ) -> None:
        self._thread = thread
        self._env = env
        self._transaction = transaction
        self._execution = execution
        self._context = context
        self._tool_env = tool_env

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
    def execution(self) -> ExecutionState | None:
        return self._execution

    @property
    def context(self) -> dict[str, Any]:
        return self._context

    async def env(self, name: str) -> str:
        return self._env.get(name, self._tool_env)

    async def get_messages(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
        include_silent: bool = False,
        max_depth: int = 0,
    ) -> MessagesResult:
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
        return MessagesResult(
            messages=[StateMessage.model_validate(messages.to_dict(r)) for r in rows],
            total=total,
            has_more=offset + len(rows) < total,
        )

    async def emit(self, event: str, data: Any) -> None:
        async with self._transaction() as (session, thread):
            await events.append(session, thread.id, "event", {"event_type": event, "data": data})

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
        return RunState(self._thread, self._env, self._transaction, execution, self._context, tool_env)
