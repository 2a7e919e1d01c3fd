"""The engine's value types, at the bottom of its module graph: they import no other engine module."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from app import environment, masking, tables, threads
from app.spec.definitions import ToolEntry
from app.spec.messages import ToolCall
from app.spec.results import ToolResult
from app.spec.state import ThreadState

Transaction = Callable[[], AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]]
Partial = Callable[[uuid.UUID, str], Awaitable[None]]  # stores a streaming message's text so far (one statement)


class MissingVariable(LookupError):
    """A variable nothing defines."""

    def __init__(self, name: str, text: str | None = None) -> None:
        super().__init__(
            text
            or f"Variable `{name}` is not set: define it on the thread, the user, the instance, the agent or the prompt"
        )
        self.name = name


class SecretInPrompt(MissingVariable):
    """A prompt `env` part that resolves to a secret value: secrets are never rendered into prompts."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"Variable `{name}` is secret and is never rendered into a prompt: read it in a tool")


@dataclass(frozen=True)
class Env:
    """Variable resolution, highest first: thread → user → instance → agent → tool config → prompt (§8)."""

    thread: dict[str, environment.Value]
    agent: dict[str, str]
    prompt: dict[str, str]
    user: dict[str, environment.Value] = field(default_factory=dict)
    instance: dict[str, environment.Value] = field(default_factory=dict)
    declared_secret: frozenset[str] = frozenset()  # names the agent's graph declares `secret`

    def _stored(self, name: str) -> environment.Value | None:
        for layer in (self.thread, self.user, self.instance):
            if name in layer:
                return layer[name]
        return None

    def get(self, name: str, tool_env: dict[str, str] | None = None) -> str:
        stored = self._stored(name)
        if stored is not None:
            return stored.value
        for layer in (self.agent, tool_env or {}, self.prompt):
            if name in layer:
                return layer[name]
        raise MissingVariable(name)

    def is_secret(self, name: str) -> bool:
        stored = self._stored(name)
        return name in self.declared_secret or (stored is not None and stored.type == "secret")

    def secrets(self) -> list[str]:
        """Known secret values, for scrubbing (longest first, so none is left half-masked): every stored value of
        type secret, and the value of every name the graph declares secret wherever it comes from (the agent's or
        the prompt's `env` too: a declared secret is always masked, §8)."""
        found = {
            v.value
            for layer in (self.thread, self.user, self.instance)
            for name, v in layer.items()
            if v.value and (v.type == "secret" or name in self.declared_secret)
        }
        found |= {
            value
            for layer in (self.agent, self.prompt)
            for name, value in layer.items()
            if value and name in self.declared_secret
        }
        return sorted(found, key=len, reverse=True)

    def mask(self, value: Any) -> Any:
        """`value` (text, or JSON-like data) with every known secret value replaced by `***`."""
        secrets = self.secrets()
        return masking.scrub_data(value, secrets) if secrets else value


@dataclass(frozen=True)
class OfferedTool:
    """A tool the acting side may call, and what backs it."""

    name: str
    kind: str  # "callable" | "session" | "subprompt" | "handoff" | "subagent" | "subagent_create" | "subagent_message"
    entry: ToolEntry
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What one tool call produced."""

    call: ToolCall
    result: ToolResult
    arguments: dict[str, Any] | None


def error(text: str) -> ToolResult:
    """A tool call's error result."""
    return ToolResult(status="error", error=text)


@dataclass(frozen=True)
class Verdict:
    """What the step decided: go on, end the side's turn, or end the session."""

    ends: Literal["nothing", "turn", "session"]
    reason: str | None = None
    status: threads.SessionStatus | None = None
    result: dict[str, Any] | None = None


GO_ON = Verdict("nothing")  # the step ends nothing: the run goes on


class ToolState(ThreadState, Protocol):
    """The state a tool runs with, as running one needs it (`state.RunState` is one): `tools` runs tools with it
    and needs nothing from `state`."""

    @property
    def tool_timeout(self) -> float:
        """Seconds a tool run with this state may take (a tool's own `timeout` wins)."""
        ...

    def with_tool(self, tool_call_id: str, options: dict[str, Any], tool_env: dict[str, str]) -> ToolState:
        """The state one tool call sees: its call id, its options and its config env."""
        ...

    async def run_subprompt(self, entry: ToolEntry, arguments: dict[str, Any]) -> ToolResult: ...

    async def hand_off(self, agent: str) -> ToolResult: ...
