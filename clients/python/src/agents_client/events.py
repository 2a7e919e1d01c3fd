"""The events the two streams carry (`docs/events.md`): an `Event` is its name, its `seq` (the SSE `id`; None for
live-only and synthesised events) and its payload, typed by one model per event name.

`THREAD_EVENTS` and `LIFECYCLE_EVENTS` mirror the server's table of event types (a test compares them); a name this
client does not know (a newer server) is read as `Unknown`, with every field kept."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agents_client.models import Message


class Payload(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class MessageData(Payload):
    """Every insert and update of a message (pending ones too, and edits): the message as it is now."""

    message_id: str
    depth: int
    data: Message


class MessageDeleted(Payload):
    message_id: str
    depth: int


class Chunk(Payload):
    """A streamed text delta of a pending message (`message_chunk`, `reasoning_chunk`); live only."""

    message_id: str
    depth: int
    offset: int
    chunk: str
    attempt: int


class StepStarted(Payload):
    step: int
    side: str


class StepCompleted(Payload):
    step: int
    side: str
    stopped: bool


class LlmRequest(Payload):
    model: str
    attempt: int


class LlmResponse(Payload):
    model: str
    tokens: dict[str, int]
    latency_ms: float
    ttft_ms: float | None


class FallbackTriggered(Payload):
    from_: str = Field(alias="from")
    to: str
    error: str


class ToolStarted(Payload):
    tool: str
    tool_call_id: str
    depth: int = 0


class ToolCompleted(Payload):
    tool: str
    tool_call_id: str
    status: str  # `success` or `error`
    depth: int = 0


class TurnEnded(Payload):
    side: str
    reason: str | None


class SessionEnded(Payload):
    status: str
    reason: str
    result: dict[str, Any] | None = None


class ThreadStatus(Payload):
    status: str
    status_text: str | None = None


class Nothing(Payload):
    """`stopped_by_user`, `thread_terminated`: the name says it all."""


class AgentHandoff(Payload):
    from_agent: str
    to_agent: str


class SubagentEntry(Payload):
    reference: str
    name: str
    title: str | None
    description: str | None
    resumable: bool
    blocking: bool
    thread_name: str | None
    spawn_group_id: str | None
    created_at: str
    status: str
    parent_communication: str


class Custom(Payload):
    """`state.emit(event_type, data)`; the runtime's own `subagent_env_required` (a variables bootstrap) too."""

    event_type: str
    data: Any


class Error(Payload):
    code: str
    message: str


class Missed(Payload):
    """First, when the resume point is older than the retention: re-read the state through the REST routes."""

    oldest_seq: int


class Lifecycle(Payload):
    thread_id: str
    agent: str
    status: str
    name: str | None


class Unknown(Payload):
    """An event this client does not know: its fields are kept as extra attributes (`model_extra`)."""


RESTING = frozenset({"idle", "stopped", "terminated"})  # thread statuses with nothing running

THREAD_EVENTS: dict[str, type[Payload]] = {
    "message_data": MessageData,
    "message_deleted": MessageDeleted,
    "step_started": StepStarted,
    "step_completed": StepCompleted,
    "llm_request": LlmRequest,
    "llm_response": LlmResponse,
    "fallback_triggered": FallbackTriggered,
    "tool_started": ToolStarted,
    "tool_completed": ToolCompleted,
    "turn_ended": TurnEnded,
    "session_ended": SessionEnded,
    "thread_status": ThreadStatus,
    "stopped_by_user": Nothing,
    "thread_terminated": Nothing,
    "agent_handoff": AgentHandoff,
    "subagent_created": SubagentEntry,
    "subagent_status": SubagentEntry,
    "event": Custom,
    "error": Error,
    "message_chunk": Chunk,
    "reasoning_chunk": Chunk,
    "events_missed": Missed,
}
LIFECYCLE_EVENTS: dict[str, type[Payload]] = {
    "thread_created": Lifecycle,
    "thread_updated": Lifecycle,
    "thread_deleted": Lifecycle,
    "events_missed": Missed,
}


@dataclass(frozen=True)
class Event:
    """One event of a stream: `name` (the SSE `event`), `seq` (the SSE `id`, None when it has none) and `data`."""

    name: str
    seq: int | None
    data: Payload

    @property
    def at_rest(self) -> bool:
        """The thread came to rest (`idle`, `stopped`, `terminated`): the last event of a turn, ended or failed."""
        return isinstance(self.data, ThreadStatus) and self.data.status in RESTING

    @property
    def message(self) -> Message | None:
        """The message a `message_data` event carries, as it is now (None for other events)."""
        return self.data.data if isinstance(self.data, MessageData) else None


def parse(name: str, seq: int | None, text: str, table: dict[str, type[Payload]]) -> Event:
    """The event a frame holds; its payload read by the model `table` names for it."""
    raw = json.loads(text) if text else {}
    return Event(name, seq, table.get(name, Unknown).model_validate(raw))
