"""Every ORM table: columns and indexes, no behaviour. Schema changes go through `migrations/`."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.spec.definitions import Side


class Base(DeclarativeBase):
    """Declarative base of every table."""

    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSONB,
        list[Any]: JSONB,
        uuid.UUID: UUID(as_uuid=True),
    }


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Thread(Base):
    """A running instance of an agent, with its scheduling fields (`storage-and-queue.md`)."""

    __tablename__ = "threads"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    agent: Mapped[str] = mapped_column(String(200))
    origin_agent: Mapped[str | None] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(20))
    parent_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    root_id: Mapped[uuid.UUID | None]
    owner_side: Mapped[Side | None] = mapped_column(String(1))
    user_id: Mapped[str] = mapped_column(String(200))
    name: Mapped[str | None] = mapped_column(Text)
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default="{}")
    status: Mapped[str] = mapped_column(String(20), server_default="idle")
    side: Mapped[Side | None] = mapped_column(String(1))
    session_number: Mapped[int] = mapped_column(Integer, server_default="0")
    session_turns: Mapped[int] = mapped_column(Integer, server_default="0")
    session_status: Mapped[str | None] = mapped_column(String(20))
    session_reason: Mapped[str | None] = mapped_column(String(40))
    session_result: Mapped[dict[str, Any] | None]
    turn_steps: Mapped[int] = mapped_column(Integer, server_default="0")
    session_steps: Mapped[int] = mapped_column(Integer, server_default="0")
    turn_start: Mapped[int | None] = mapped_column(BigInteger)  # position of the input the current turn answers
    stopped: Mapped[bool] = mapped_column(Boolean, server_default="false")
    status_text: Mapped[str | None] = mapped_column(Text)  # the last `sessionStatus` message
    terminated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    last_message_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # scheduling
    runnable_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[uuid.UUID | None]
    lease_owner: Mapped[str | None] = mapped_column(String(200))  # until when: the thread's `Lease` row
    attempt: Mapped[int] = mapped_column(Integer, server_default="0")
    event_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")
    messages_removed: Mapped[int] = mapped_column(Integer, server_default="0")  # deletions (`messages.remove`)
    step_open: Mapped[bool] = mapped_column(Boolean, server_default="false")  # a step's tools are not all evaluated
    has_children: Mapped[bool] = mapped_column(Boolean, server_default="false")  # set by a trigger on a child's insert
    # the registry entry of a child (§6.5)
    title: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    resumable: Mapped[bool] = mapped_column(Boolean, server_default="false")
    blocking: Mapped[bool] = mapped_column(Boolean, server_default="true")
    receives_messages: Mapped[str | None] = mapped_column(String(10))
    parent_communication: Mapped[str | None] = mapped_column(String(10))
    spawn_group_id: Mapped[uuid.UUID | None]
    parent_call_id: Mapped[str | None] = mapped_column(String(200))  # the parent's tool call a session answers
    parent_call_name: Mapped[str | None] = mapped_column(String(200))
    parent_call_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # when that call was made
    terminal: Mapped[bool] = mapped_column(Boolean, server_default="false")  # its agent has terminal session tools

    __table_args__ = (
        Index("threads_runnable", "runnable_since", postgresql_where=text("runnable_since IS NOT NULL")),
        Index("threads_user_created", "user_id", "created_at"),
        Index("threads_parent", "parent_id"),
    )


class Lease(Base):
    """How long a claim (`threads.lease_token`) holds: a row of its own, renewed by the heartbeat alone, so that no
    engine transaction holding the thread row can stop its renewal (`app/queue.py`)."""

    __tablename__ = "leases"

    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True)
    token: Mapped[uuid.UUID]
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Message(Base):
    """The spec's `Message`; `position` orders a thread's history."""

    __tablename__ = "messages"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(BigInteger, Identity(always=False))
    role: Mapped[str] = mapped_column(String(20))
    side: Mapped[Side | None] = mapped_column(String(1))
    content: Mapped[str | None] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[list[Any] | None]
    tool_call_id: Mapped[str | None] = mapped_column(String(200))
    tool_status: Mapped[str | None] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), server_default="completed")
    silent: Mapped[bool] = mapped_column(Boolean, server_default="false")
    depth: Mapped[int] = mapped_column(Integer, server_default="0")
    parent_id: Mapped[uuid.UUID | None]
    attachments: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    reasoning_content: Mapped[str | None] = mapped_column(Text)
    reasoning_details: Mapped[list[Any] | None]
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default="{}")
    subagent_id: Mapped[uuid.UUID | None]
    prompt: Mapped[str | None] = mapped_column(String(200))
    model: Mapped[str | None] = mapped_column(String(200))
    usage: Mapped[dict[str, Any] | None]
    session_number: Mapped[int] = mapped_column(Integer, server_default="0")
    turn: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    # Set by the database on every insert and update (sequence `message_revs`, trigger `messages_rev`): the engine
    # reads a thread's messages changed since a revision (`changes.changed`). Read it from a query: an object you
    # updated still carries the old value.
    rev: Mapped[int] = mapped_column(BigInteger, server_default=text("nextval('message_revs')"))

    __table_args__ = (
        Index("messages_thread_position", "thread_id", "position"),
        Index("messages_thread_rev", "thread_id", "rev"),
    )


class Inbox(Base):
    """A thread's durable ordered input, drained in id order by the lease holder."""

    __tablename__ = "inbox"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(20))
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = _now()
    set_aside_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # delivery failed: kept, skipped
    error: Mapped[str | None] = mapped_column(Text)  # why it was set aside

    __table_args__ = (Index("inbox_thread", "thread_id", "id"),)


class Event(Base):
    """The per-thread event log; `seq` comes from `threads.event_seq` under the row lock."""

    __tablename__ = "events"

    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    type: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = _now()

    __table_args__ = (Index("events_created", "created_at"),)


class Counter(Base):
    """A named counter; the `lifecycle` row gives the lifecycle stream its seq under its row lock."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(40), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, server_default="0")


class LifecycleEvent(Base):
    """The lifecycle stream (`GET /events`): threads created, updated, deleted, in commit order."""

    __tablename__ = "lifecycle_events"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[str] = mapped_column(String(200))
    thread_id: Mapped[uuid.UUID]
    type: Mapped[str] = mapped_column(String(40))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = _now()

    __table_args__ = (Index("lifecycle_user_seq", "user_id", "seq"), Index("lifecycle_created", "created_at"))


class Log(Base):
    """One LLM request, tool call or hook run."""

    __tablename__ = "logs"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(20))
    message_id: Mapped[uuid.UUID | None]
    model: Mapped[str | None] = mapped_column(String(200))
    provider: Mapped[str | None] = mapped_column(String(40))
    tool: Mapped[str | None] = mapped_column(String(200))
    attempt: Mapped[int] = mapped_column(Integer, server_default="1")
    status: Mapped[str] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text)
    input_tokens: Mapped[int | None]
    output_tokens: Mapped[int | None]
    cached_tokens: Mapped[int | None]
    reasoning_tokens: Mapped[int | None]
    cost: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    finish_reason: Mapped[str | None] = mapped_column(String(40))
    retry_of: Mapped[uuid.UUID | None]
    fallback_of: Mapped[uuid.UUID | None]
    request: Mapped[dict[str, Any] | None]
    response: Mapped[dict[str, Any] | None]
    # an LLM request's whole request under `LOG_REQUESTS=full` (secrets masked), read only by `logs.one`
    request_full: Mapped[dict[str, Any] | None] = mapped_column(deferred=True)
    created_at: Mapped[datetime] = _now()

    __table_args__ = (Index("logs_thread_created", "thread_id", "created_at"), Index("logs_created", "created_at"))


class EnvValue(Base):
    """A variable value at thread, user or instance scope (secrets encrypted with the server key)."""

    __tablename__ = "env_values"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    scope: Mapped[str] = mapped_column(String(20))
    owner: Mapped[str] = mapped_column(String(200))
    name: Mapped[str] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(10))
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()

    __table_args__ = (UniqueConstraint("scope", "owner", "name", name="env_values_scope_owner_name"),)


class ApiKey(Base):
    """An API key, stored as its SHA-256."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    user_id: Mapped[str] = mapped_column(String(200))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    admin: Mapped[bool] = mapped_column(Boolean, server_default="false")
    created_at: Mapped[datetime] = _now()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class VariableRequest(Base):
    """A subagent creation waiting for scoped variables (§6.7): the original payload, what is missing."""

    __tablename__ = "variable_requests"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    parent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    agent: Mapped[str] = mapped_column(String(200))
    required: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    missing: Mapped[list[Any]] = mapped_column(JSONB, server_default="[]")
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")
    status: Mapped[str] = mapped_column(String(20), server_default="pending")
    child_id: Mapped[uuid.UUID | None]
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()

    __table_args__ = (Index("variable_requests_parent", "parent_id"),)


class Blob(Base):
    """File content, stored once and addressed by its SHA-256; its bytes are in `blob_chunks`."""

    __tablename__ = "blobs"

    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _now()


class BlobChunk(Base):
    """About 1 MB of a blob, so files stream in and out."""

    __tablename__ = "blob_chunks"

    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Thumbnail(Base):
    """A JPEG thumbnail of an image blob, made once per content and size; it goes when its blob is collected."""

    __tablename__ = "thumbnails"

    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256", ondelete="CASCADE"), primary_key=True)
    size: Mapped[int] = mapped_column(Integer, primary_key=True)  # pixels, the longer side at most
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _now()


class File(Base):
    """An entry of a thread's file tree: a directory, or a file pointing at its blob."""

    __tablename__ = "files"

    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(Text, primary_key=True)
    is_dir: Mapped[bool] = mapped_column(Boolean, server_default="false")
    sha256: Mapped[str | None] = mapped_column(ForeignKey("blobs.sha256"))
    size: Mapped[int] = mapped_column(BigInteger, server_default="0")
    mime_type: Mapped[str | None] = mapped_column(String(200))
    width: Mapped[int | None] = mapped_column(Integer)
    height: Mapped[int | None] = mapped_column(Integer)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default="{}")
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()

    __table_args__ = (Index("files_sha256", "sha256"),)


class Effect(Base):
    """A scheduled effect (`semantics.md` §10); `app/effects.py` documents its statuses."""

    __tablename__ = "effects"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    args: Mapped[dict[str, Any]]
    run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(20), server_default="scheduled")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()

    __table_args__ = (
        Index("effects_due", "run_at", postgresql_where=text("status = 'scheduled'")),
        Index("effects_thread", "thread_id", "run_at"),
        Index(
            "effects_finished", "updated_at", postgresql_where=text("status IN ('done', 'failed', 'cancelled')")
        ),  # retention
    )


class MetricTotal(Base):
    """A metric sample's total over every process that ever ran (`app/metrics.py`): each worker adds its counts."""

    __tablename__ = "metrics"

    sample: Mapped[str] = mapped_column(String(200), primary_key=True)  # `agents_steps_total`, `..._bucket`
    labels: Mapped[str] = mapped_column(Text, primary_key=True)  # canonical JSON: `{"agent":"assistant"}`
    family: Mapped[str] = mapped_column(String(200))  # the series the sample belongs to: `agents_steps`
    value: Mapped[float] = mapped_column(Float, server_default="0")
    updated_at: Mapped[datetime] = _now()  # the last flush that added to it (`app/retention.py`)


class SchemaCompat(Base):
    """One row: the migration the schema is at and the oldest release (named by its newest migration) whose code runs
    on it, written by every upgrade (`app/migrations.py`) and read by a process that finds a migration it does not
    know."""

    __tablename__ = "schema_compat"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, server_default="1")
    revision: Mapped[str] = mapped_column(Text)
    runs_with: Mapped[str] = mapped_column(Text)

    __table_args__ = (CheckConstraint("id = 1", name="schema_compat_one_row"),)
