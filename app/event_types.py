"""The event types: every type a stream can carry and its payload, as a table (`docs/events.md` describes each).

`events.append` writes the stored ones (one typed overload each); the others are live only (`hub.Publisher`) or
synthesised by a stream (`events_missed`)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict  # pydantic reads `typing`'s only from Python 3.12 (app/api/frames.py)

from app.spec.definitions import Side


class MessageData(TypedDict):
    message_id: str
    depth: int
    data: dict[str, Any]  # the API's `Message` (`messages.to_dict`)


class MessageDeleted(TypedDict):
    message_id: str
    depth: int


class Chunk(TypedDict):
    """A streamed text delta of a pending message; live only (`hub.Publisher`), never stored."""

    message_id: str
    depth: int
    offset: int
    chunk: str
    attempt: int


class StepStarted(TypedDict):
    step: int
    side: Side


class StepCompleted(TypedDict):
    step: int
    side: Side
    stopped: bool


class LlmRequest(TypedDict):
    model: str
    attempt: int


class LlmResponse(TypedDict):
    model: str
    tokens: dict[str, int]  # `Usage.as_dict`
    latency_ms: float
    ttft_ms: float | None


FallbackTriggered = TypedDict("FallbackTriggered", {"from": str, "to": str, "error": str})  # `from`: a keyword


class ToolStarted(TypedDict):
    tool: str
    tool_call_id: str
    depth: NotRequired[int]  # a subprompt's call


class ToolCompleted(TypedDict):
    tool: str
    tool_call_id: str
    status: str  # `success` or `error`
    depth: NotRequired[int]


class TurnEnded(TypedDict):
    side: Side
    reason: str | None


class SessionEnded(TypedDict):
    status: str  # `threads.SessionStatus`
    reason: str
    result: NotRequired[dict[str, Any]]  # `{content, attachments}` of a session tool


class ThreadStatus(TypedDict):
    status: str  # `threads.Status`
    status_text: NotRequired[str | None]  # a status report (`state.set_status`, a `sessionStatus` tool)


class Nothing(TypedDict):
    """The payload of an event that says all by its type."""


class AgentHandoff(TypedDict):
    from_agent: str
    to_agent: str


class SubagentEntry(TypedDict):
    """A child's registry entry (the spec's `SubagentRegistryEntry`, `children.entry`)."""

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


class Custom(TypedDict):
    """`state.emit(event_type, data)`, or the runtime's own `subagent_env_required`."""

    event_type: str
    data: Any


class Error(TypedDict):
    code: str
    message: str


class Missed(TypedDict):
    """Synthesised by a stream, first, when its resume point is older than the retention; never stored."""

    oldest_seq: int


class Lifecycle(TypedDict):
    thread_id: str
    agent: str
    status: str
    name: str | None


LifecycleEvent = Literal["thread_created", "thread_updated", "thread_deleted"]

# the table: every event type and its payload. `append` writes the stored ones (each overload below takes one of
# them); the others are live only (`hub.Publisher`) or synthesised by a stream.
STORED: dict[str, type] = {
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
}
THREAD_EVENTS: dict[str, type] = {
    **STORED,
    "message_chunk": Chunk,  # live only
    "reasoning_chunk": Chunk,  # live only
    "events_missed": Missed,  # synthesised
}
LIFECYCLE_EVENTS: dict[str, type] = {
    "thread_created": Lifecycle,
    "thread_updated": Lifecycle,
    "thread_deleted": Lifecycle,
    "events_missed": Missed,  # synthesised
}
