"""The resources the server answers with (`docs/http-api.md`), as pydantic models.

Fields a newer server adds are kept (`extra="allow"`), so an older client reads them as attributes too."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ThreadStatus = Literal["idle", "queued", "running", "waiting", "stopped", "terminated"]


class Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Session(Model):
    number: int
    turns: int
    status: str | None
    reason: str | None = None
    result: dict[str, Any] | None = None
    status_text: str | None = None


class Thread(Model):
    id: uuid.UUID
    agent: str
    origin_agent: str | None
    type: str
    parent_id: uuid.UUID | None
    user_id: str
    name: str | None
    tags: list[str]
    status: ThreadStatus
    side: str | None
    session: Session
    env: dict[str, str | None] | None  # null in listings: `env_types` names the variables there
    env_types: dict[str, str]
    created_at: datetime
    updated_at: datetime
    last_message_at: datetime | None
    terminated_at: datetime | None
    children_count: int


class ThreadList(Model):
    threads: list[Thread]
    next_cursor: str | None


class Deleted(Model):
    deleted: list[uuid.UUID]


class ToolCallFunction(Model):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Model):
    id: str
    type: str = "function"
    function: ToolCallFunction


class Message(Model):
    id: uuid.UUID
    role: str
    side: str | None
    content: str | None
    name: str | None
    tool_calls: list[ToolCall] | None
    tool_call_id: str | None
    tool_status: str | None
    status: str  # `pending`, `completed`, `failed`
    silent: bool
    depth: int
    parent_id: uuid.UUID | None
    attachments: list[dict[str, Any]]
    reasoning_content: str | None
    metadata: dict[str, Any]
    subagent_id: uuid.UUID | None
    subagent_name: str | None = None
    subagent_title: str | None = None
    subagent_description: str | None = None
    subagent_status: str | None = None
    subagent_resumable: bool | None = None
    subagent_blocking: bool | None = None
    subagent_thread_name: str | None = None
    subagent_spawn_group_id: uuid.UUID | None = None
    model: str | None
    usage: dict[str, Any] | None
    created_at: datetime


class MessageList(Model):
    messages: list[Message]
    next_cursor: str | None


class Queued(Model):
    """`POST /messages` without `wait`: the input is queued under this id."""

    message_id: uuid.UUID
    status: str = "queued"


class TurnError(Model):
    code: str
    message: str


class Turn(Model):
    """`POST /messages?wait=`: the input's turn, ended (`done`) or as far as it got."""

    message_id: uuid.UUID
    done: bool
    status: ThreadStatus
    outcome: Literal["completed", "failed", "stopped", "terminated"] | None
    error: TurnError | None
    messages: list[Message]

    @property
    def reply(self) -> str | None:
        """The text of the turn's last assistant message (None when it wrote none)."""
        answers = [m for m in self.messages if m.role == "assistant" and m.content]
        return answers[-1].content if answers else None


class Variable(Model):
    name: str
    type: str
    required: bool
    scoped: bool
    description: str


class Agent(Model):
    name: str
    type: str
    title: str | None
    description: str | None
    icon: str | None
    expose_as_tool: bool
    variables: list[Variable]


class Side(Model):
    label: str | None
    prompt: str
    stop_on_response: bool = True
    stop_tool: str | None = None
    max_steps: int | None = None
    session_tools: dict[str, str] = Field(default_factory=dict)


class ToolLink(Model):
    """One entry of a prompt's `tools`: `kind` is `tool`, `subprompt`, `subagent` or `handoff`."""

    name: str
    kind: str
    description: str | None
    optional: str | None
    blocking: bool | None
    resumable: bool | None
    immediate: bool | None


class PromptDetail(Model):
    name: str
    model: str
    description: str | None
    include_chat: bool
    includes: list[str]
    hooks: list[str]
    tools: list[ToolLink]


class AgentDetail(Agent):
    side_a: Side
    side_b: Side | None
    prompts: list[str]
    max_session_turns: int | None = None
    hooks: list[str] = Field(default_factory=list)
    prompt_details: list[PromptDetail] = Field(default_factory=list)


class Status(Model):
    status: str


class Health(Status):
    """`GET /health`: the process is up, and the server's version (the one number the clients carry too)."""

    version: str


class FileRecord(Model):
    path: str
    name: str
    type: Literal["file", "directory"]
    size: int
    mime_type: str | None
    etag: str | None
    width: int | None = None
    height: int | None = None


class FileList(Model):
    path: str
    entries: list[FileRecord]


class GrepMatch(Model):
    path: str
    line: int
    text: str


class GrepResult(Model):
    pattern: str
    matches: list[GrepMatch]


class FileUsage(Model):
    files: int
    directories: int
    bytes: int


class Effect(Model):
    id: uuid.UUID
    name: str
    args: dict[str, Any]
    run_at: datetime
    status: str  # `scheduled`, `queued`, `running`, `done`, `failed`, `cancelled`
    attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime


class EffectList(Model):
    effects: list[Effect]


class SubagentEntry(Model):
    reference: uuid.UUID
    name: str
    title: str | None
    description: str | None
    resumable: bool
    blocking: bool
    thread_name: str | None
    spawn_group_id: uuid.UUID | None
    created_at: datetime
    status: str
    parent_communication: str


class SubagentList(Model):
    subagents: list[SubagentEntry]


class VariableRequest(Model):
    """A subagent creation waiting for scoped variables: their names, never values."""

    request_id: uuid.UUID
    parent_thread_id: uuid.UUID
    agent: str
    required: list[str]
    missing: list[str]
    status: Literal["pending", "success"]
    child_thread_id: uuid.UUID | None = None


class VariablesDone(Model):
    request_id: uuid.UUID
    child_thread_id: uuid.UUID
    status: str


class StreamToken(Model):
    token: str
    expires_in: float
    url: str  # the stream's path with the token


class Log(Model):
    """One LLM request, tool call or hook run of a thread."""

    id: uuid.UUID
    kind: str  # `llm`, `tool`, `hook`
    message_id: uuid.UUID | None
    model: str | None
    provider: str | None
    tool: str | None
    attempt: int
    status: str
    error: str | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    cost: float | None
    latency_ms: float | None
    ttft_ms: float | None
    finish_reason: str | None
    response: dict[str, Any] | None
    retry_of: uuid.UUID | None
    fallback_of: uuid.UUID | None
    request: dict[str, Any] | None
    created_at: datetime


class LogDetail(Log):
    """One log with the whole request its model call was sent (`LOG_REQUESTS=full`), else `request_full` None."""

    request_full: dict[str, Any] | None


class LogList(Model):
    logs: list[Log]
    next_cursor: str | None


class EnvVariable(Model):
    name: str
    type: Literal["text", "secret"]
    value: str | None  # null for a secret


class EnvList(Model):
    env: dict[str, str | None]
    env_types: dict[str, str]
