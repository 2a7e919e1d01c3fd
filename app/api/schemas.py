"""Request and response bodies of the HTTP contract (`http-api.md`)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from app import db, environment
from app.spec import definitions
from app.spec.state import StateLog


class In(BaseModel):
    """Request bodies: unknown fields are errors, and so is a NUL character anywhere (Postgres cannot store it)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        if db.has_nul(data):
            raise ValueError(db.NUL_REFUSED)
        return data


# a character that is not white space, read alike by Python's `re` and by JSON Schema's (ECMA-262) patterns: each
# one's `\s` plus what only the other counts as white space
TEXT = "[^\\s\\u001c-\\u001f\\u0085\\ufeff]"
BASE64 = r"^(data:[^,]*,)?(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


# Every request field is bounded (`http-api.md`, Limits; `tests/test_openapi.py` fails on one that is not);
# `x-max-bytes` bounds a value's size in UTF-8 bytes (for free-form JSON: its encoding). A bound a setting decides is
# named under `BY_SETTING` and made the setting's number when the document is built (`openapi.amend`).
BY_SETTING = "x-bounds-by-setting"
AGENT_CHARS = 200
NAME_CHARS = 500  # a thread's display name
TAG_CHARS = 128
MAX_TAGS = 50
CONTENT_CHARS = 1_000_000  # a message's text (and the body's own limit, `MAX_BODY_BYTES`)
MAX_FILES = 20  # files of one message: base64 `attachments`, or multipart file parts
METADATA_BYTES = 16 * 1024  # a message's `metadata`, encoded as JSON
MAX_MESSAGES = 100  # messages queued by `POST /threads`
MAX_NAMES = 1000  # variable names in `secrets`, `env_delete`

# schema only: `environment.check` answers 422 `invalid_variable_name`, 413 past the limits, wherever env enters
ENV_NAME: JsonDict = {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": environment.NAME_CHARS}
ENV: JsonDict = {
    "description": "at most `ENV_MAX_VARIABLES` names, each value at most `ENV_MAX_VALUE_BYTES` bytes",
    "propertyNames": ENV_NAME,
    BY_SETTING: {"maxProperties": "ENV_MAX_VARIABLES"},
    "additionalProperties": {"type": "string", BY_SETTING: {"x-max-bytes": "ENV_MAX_VALUE_BYTES"}},
}
Tag = Annotated[str, Field(max_length=TAG_CHARS)]
EnvName = Annotated[str, Field(max_length=environment.NAME_CHARS)]
# a cursor of a list (`cursors.encode`): some 100 characters; one this server did not give out is 400 `bad_cursor`
Cursor = Annotated[str | None, Query(max_length=200)]


class AttachmentIn(In):
    name: str = Field(min_length=1, max_length=255)
    mime_type: str = Field(min_length=1, max_length=200)
    data: str = Field(
        description="base64 content (a `data:` URL prefix is allowed), within the body's `MAX_BODY_BYTES`",
        pattern=BASE64,
        json_schema_extra={BY_SETTING: {"x-max-bytes": "MAX_BODY_BYTES"}},
    )


class MessageIn(In):
    model_config = ConfigDict(
        extra="forbid",
        # what `_not_empty` checks, so clients (and schema-driven tests) can see it; inside `allOf`, as client
        # generators read an `anyOf` beside `properties` as a union of two other types
        json_schema_extra={
            "allOf": [
                {
                    "anyOf": [
                        {"required": ["content"], "properties": {"content": {"type": "string", "pattern": TEXT}}},
                        {"required": ["attachments"], "properties": {"attachments": {"type": "array", "minItems": 1}}},
                    ]
                }
            ]
        },
    )

    content: str | None = Field(default=None, max_length=CONTENT_CHARS)
    role: Literal["user", "assistant", "system"] = "user"
    attachments: list[AttachmentIn] = Field(default_factory=list, max_length=MAX_FILES)
    silent: StrictBool = False
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description=f"free-form JSON, at most {METADATA_BYTES} bytes encoded",
        json_schema_extra={"x-max-bytes": METADATA_BYTES},
    )

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        _json_within(value, METADATA_BYTES)
        return value

    @model_validator(mode="after")
    def _not_empty(self, info: ValidationInfo) -> MessageIn:
        """Text or a file: an empty message would start a turn about nothing (`files` in the context counts the
        multipart parts)."""
        files = (info.context or {}).get("files", 0)
        if not (self.content and re.search(TEXT, self.content)) and not self.attachments and not files:
            raise ValueError("a message needs text in `content` or at least one attachment")
        return self


def _json_within(value: Any, limit: int) -> None:
    """`ValueError` unless the JSON encoding of `value` has at most `limit` UTF-8 bytes."""
    try:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))
    except RecursionError:
        raise ValueError("nests too deep") from None
    if size > limit:
        raise ValueError(f"at most {limit} bytes of JSON (this is {size})")


class MessageEdit(In):
    content: str = Field(max_length=CONTENT_CHARS, description="the message's new text")


class ThreadIn(In):
    agent: str = Field(validation_alias=AliasChoices("agent", "agent_id"), min_length=1, max_length=AGENT_CHARS)
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=ENV)
    secrets: list[EnvName] = Field(default_factory=list, max_length=MAX_NAMES)
    tags: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    name: str | None = Field(default=None, max_length=NAME_CHARS)
    messages: list[MessageIn] = Field(default_factory=list, max_length=MAX_MESSAGES)


class ThreadPatch(In):
    tags: list[Tag] | None = Field(default=None, max_length=MAX_TAGS)
    name: str | None = Field(default=None, max_length=NAME_CHARS)
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=ENV)
    secrets: list[EnvName] = Field(default_factory=list, max_length=MAX_NAMES)
    env_delete: list[EnvName] = Field(default_factory=list, max_length=MAX_NAMES)


class EnvIn(In):
    value: str = Field(
        description="at most `ENV_MAX_VALUE_BYTES` bytes",
        json_schema_extra={BY_SETTING: {"x-max-bytes": "ENV_MAX_VALUE_BYTES"}},
    )
    type: Literal["text", "secret"] = "text"


class EnvVariable(BaseModel):
    """One user or instance value; a secret's `value` is null."""

    name: str
    type: Literal["text", "secret"]
    value: str | None


class EnvList(BaseModel):
    """A scope's values: `env` has null for secrets, `env_types` every name's type."""

    env: dict[str, str | None]
    env_types: dict[str, str]


class Deleted(BaseModel):
    deleted: list[uuid.UUID]


class ContinueIn(In):
    side: definitions.Side = "a"


class Session(BaseModel):
    number: int
    turns: int
    status: str | None
    reason: str | None = None
    result: dict[str, Any] | None = None
    status_text: str | None = Field(default=None, description="the message of the last `sessionStatus` call")


class Thread(BaseModel):
    id: uuid.UUID
    agent: str
    origin_agent: str | None
    type: str
    parent_id: uuid.UUID | None
    user_id: str
    name: str | None
    tags: list[str]
    status: str
    side: str | None
    session: Session
    env: dict[str, str | None] | None = Field(
        description="text values, secret ones null; null in listings (`env_types` names the variables there)"
    )
    env_types: dict[str, str]
    created_at: datetime
    updated_at: datetime
    last_message_at: datetime | None
    terminated_at: datetime | None
    children_count: int


class ThreadList(BaseModel):
    threads: list[Thread]
    next_cursor: str | None


class Log(StateLog):
    """One LLM request, tool call or hook run; `retry_of` / `fallback_of` link the attempts of one call."""

    id: uuid.UUID  # type: ignore[assignment]  # the same ids, typed as the API's other ids are
    message_id: uuid.UUID | None  # type: ignore[assignment]
    retry_of: uuid.UUID | None
    fallback_of: uuid.UUID | None
    request: dict[str, Any] | None


class LogDetail(Log):
    """One log with the whole request its model call was sent (`LOG_REQUESTS=full`; null when it kept the brief)."""

    request_full: dict[str, Any] | None = Field(
        description="`{model, messages, tools, tool_choice, parallel_tool_calls, reasoning, provider_options, "
        "max_tokens}` as sent, known secret values masked as `***`, an image's data as its size"
    )


class LogList(BaseModel):
    logs: list[Log]
    next_cursor: str | None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(BaseModel):
    id: uuid.UUID
    role: str
    side: str | None
    content: str | None
    name: str | None
    tool_calls: list[ToolCall] | None
    tool_call_id: str | None
    tool_status: str | None
    status: str
    silent: bool
    depth: int
    parent_id: uuid.UUID | None
    attachments: list[dict[str, Any]]
    reasoning_content: str | None
    metadata: dict[str, Any]
    subagent_id: uuid.UUID | None
    # projected from the registry entry of `subagent_id` (§6.5)
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


class MessageList(BaseModel):
    messages: list[Message]
    next_cursor: str | None


class Queued(BaseModel):
    message_id: uuid.UUID
    status: Literal["queued"] = "queued"


class TurnError(BaseModel):
    """Why a turn failed: the `error` event's `{code, message}` (known secret values masked)."""

    code: str
    message: str


class Turn(BaseModel):
    """`POST /threads/{id}/messages?wait=`: the posted input's turn, ended (`done`) or as far as it got."""

    message_id: uuid.UUID
    done: bool = Field(description="the turn ended (or the input was set aside); false: the time was up first")
    status: Literal["idle", "queued", "running", "waiting", "stopped", "terminated"] = Field(
        description="the thread's status as the turn ended, or now"
    )
    outcome: Literal["completed", "failed", "stopped", "terminated"] | None = Field(
        description="how the turn ended: `completed`, `failed` (`error` says why), `stopped` or `terminated`; "
        "null while it has not (`done: false`)"
    )
    error: TurnError | None = Field(description="why the turn failed (`outcome: failed`); null otherwise")
    messages: list[Message] = Field(
        description="the input, then the messages its turn wrote (depth 0, silent ones left out), as they are now"
    )


class Variable(BaseModel):
    name: str
    type: str
    required: bool
    scoped: bool
    description: str = Field(description='"" when the declaration gives none (the spec\'s `VariableDefinition`)')


class Agent(BaseModel):
    name: str
    type: str
    title: str | None
    description: str | None
    icon: str | None = Field(description="the agent's `icon`; an absolute path as a full URL on the server's base")
    expose_as_tool: bool
    variables: list[Variable]


class Side(BaseModel):
    label: str | None
    prompt: str
    stop_on_response: bool = Field(description="the side's turn ends when its model answers without a tool call")
    stop_tool: str | None = Field(description="a tool whose call ends the side's turn")
    max_steps: int | None
    session_tools: dict[str, str] = Field(
        description="the session tools the side binds: `stop`, `fail` and `status`, each to its tool's name"
    )


class ToolLink(BaseModel):
    """One entry of a prompt's `tools`, by what it refers to: a `tool` (a callable), a `subprompt`, a `subagent`
    (a `dual_ai` agent) or a `handoff` (an `ai_human` agent); the subagent fields are null for the other kinds."""

    name: str
    kind: Literal["tool", "subprompt", "subagent", "handoff"]
    description: str | None
    optional: str | None = Field(description="the variable that turns the entry on (`true`, `1` or `yes`)")
    blocking: bool | None
    resumable: bool | None
    immediate: bool | None


class PromptDetail(BaseModel):
    """A prompt an agent runs (a side's, or a subprompt's reached from one), with its model, tools and hooks."""

    name: str
    model: str
    description: str | None
    include_chat: bool
    includes: list[str] = Field(description="the prompts whose text this prompt includes")
    hooks: list[str] = Field(description="the hooks that run for this prompt (its own `hooks`, else the agent's)")
    tools: list[ToolLink]


class AgentDetail(Agent):
    side_a: Side
    side_b: Side | None
    prompts: list[str]
    max_session_turns: int | None
    hooks: list[str] = Field(description="the agent's hooks (a prompt's own `hooks` replace them for that prompt)")
    prompt_details: list[PromptDetail] = Field(
        description="every prompt of `prompts` and the subprompts they reach, in that order: the agent's shape"
    )


class Status(BaseModel):
    status: str


class Health(BaseModel):
    status: Literal["ok"]
    version: str = Field(description="the server's version (`info.version` of the OpenAPI document)")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class Error(BaseModel):
    error: ErrorBody


class FileRecord(BaseModel):
    """An entry of a thread's file tree; `etag` is the content's SHA-256 (files only)."""

    path: str
    name: str
    type: Literal["file", "directory"]
    size: int
    mime_type: str | None
    etag: str | None
    width: int | None = None
    height: int | None = None


class FileList(BaseModel):
    path: str
    entries: list[FileRecord]


class GrepMatch(BaseModel):
    path: str
    line: int
    text: str


class GrepResult(BaseModel):
    """Lines of the thread's text files that match `pattern` (at most 1000)."""

    pattern: str
    matches: list[GrepMatch]


class FileUsage(BaseModel):
    files: int
    directories: int
    bytes: int


class Effect(BaseModel):
    """A scheduled effect; `status` ∈ scheduled, queued, running, done, failed, cancelled."""

    id: uuid.UUID
    name: str
    args: dict[str, Any]
    run_at: datetime
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime


class EffectList(BaseModel):
    effects: list[Effect]


class SubagentEntry(BaseModel):
    """The spec's `SubagentRegistryEntry`: `status` is `running`, `idle`, `waiting`, `failed`, `terminated` or the
    free text of the child's last status report."""

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
    parent_communication: Literal["implicit", "explicit"]


class SubagentList(BaseModel):
    subagents: list[SubagentEntry]


class VariableRequest(BaseModel):
    """A subagent creation waiting for scoped variables (§6.7)."""

    request_id: uuid.UUID
    parent_thread_id: uuid.UUID
    agent: str
    required: list[str]
    missing: list[str]
    status: Literal["pending", "success"]
    child_thread_id: uuid.UUID | None = None


class VariablesIn(In):
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=ENV)


class VariablesDone(BaseModel):
    request_id: uuid.UUID
    child_thread_id: uuid.UUID
    status: Literal["success"]


class StreamTokenIn(In):
    thread_id: uuid.UUID | None = Field(default=None, description="the thread whose stream; none: `/events`")


class StreamToken(BaseModel):
    token: str
    expires_in: float = Field(description="seconds it may open the stream for")
    url: str = Field(description="the stream's path with the token, for `new EventSource(url)`")
