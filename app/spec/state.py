"""The `ThreadState` protocol: the one API user code (tools, hooks, effects, endpoints) sees."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel


@dataclass(frozen=True)
class ExecutionState:
    """Where the thread's execution is; tools use `tool_call_id` and `attempt` as idempotency keys."""

    side: Literal["a", "b"]
    step: int
    session: int
    attempt: int
    tool_call_id: str | None = None
    tool_options: dict[str, Any] | None = None


class StateMessage(BaseModel):
    """A stored message as user code sees it."""

    id: str
    role: str
    side: str | None
    content: str | None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    tool_status: str | None = None
    status: str
    silent: bool = False
    depth: int = 0
    metadata: dict[str, Any] = {}
    created_at: datetime


class MessagesResult(BaseModel):
    """A page of messages."""

    messages: list[StateMessage]
    total: int
    has_more: bool


class ThreadState(Protocol):
    """What a tool gets as `state`."""

    @property
    def thread_id(self) -> str: ...

    @property
    def agent_id(self) -> str: ...

    @property
    def user_id(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...

    @property
    def execution(self) -> ExecutionState | None: ...

    @property
    def context(self) -> dict[str, Any]: ...

    async def env(self, name: str) -> str:
        """The value of a variable, resolved thread → agent → tool config → prompt."""
        ...

    async def get_messages(
        self,
        *,
        limit: int = 100,
        offset: int = 0,
        order: Literal["asc", "desc"] = "asc",
        include_silent: bool = False,
        max_depth: int = 0,
    ) -> MessagesResult:
        """Messages of this thread."""
        ...

    async def emit(self, event: str, data: Any) -> None:
        """Send a custom `event` to the thread's stream."""
        ...
