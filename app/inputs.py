"""Inbox payloads: what a thread's waiting input is, by kind, validated once when delivery reads it (`read`).

Writers store plain JSON (`queue.enqueue`, `queue.post`); `engine/inbox.py` delivers each kind."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from app import errors
from app.spec.definitions import Side


class Kind(StrEnum):
    """An inbox row's `kind`: what its payload is and how delivery handles it (`engine/inbox.py`)."""

    MESSAGE = "message"  # a posted message: `{id, role, content, ...}` added to the history
    CONTINUE = "continue"  # `POST /continue`: `{side}` acts next
    TOOL = "tool"  # `state.queue_tool` outside a tool call: `{call: ToolCall}`
    SPAWN = "spawn"  # a new thread whose side A prompt has `immediate` subagents: start them (§6.6)
    CHILD_RESULT = "child_result"  # a blocking child's session ended: `{call_id, name, child_id, status, content,
    # attachments, started_at}` answers the parent's open tool call
    EFFECT = "effect"  # a due effect (`app/effects.py`): `{effect_id, name}`; consumed when its handler finished


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True)


class MessageInput(_Payload):
    """A posted message (`messages.enqueue`, `POST /messages`), added to the history as it is delivered."""

    kind: Literal[Kind.MESSAGE]
    id: uuid.UUID  # the id the message is stored with
    role: str
    content: str | None = None
    silent: bool = False
    metadata: dict[str, Any] | None = None
    attachments: list[Any] | None = None
    queued_at: str | None = None

    def fields(self) -> dict[str, Any]:
        """The payload as it was stored (what the `before_create_message` hooks see of it)."""
        return self.model_dump(mode="json", exclude={"kind"}, exclude_unset=True)


class ContinueInput(_Payload):
    """`POST /continue`: the side that acts next."""

    kind: Literal[Kind.CONTINUE]
    side: Side = "a"


class ToolInput(_Payload):
    """`state.queue_tool` outside a tool call: the call, stored as the acting side's own."""

    kind: Literal[Kind.TOOL]
    call: dict[str, Any]  # a `ToolCall`, stored as it is


class SpawnInput(_Payload):
    """A new thread's `immediate` subagents of side A, to start."""

    kind: Literal[Kind.SPAWN]


class ChildResultInput(_Payload):
    """A blocking child's session ended: its result answers the parent's open tool call."""

    kind: Literal[Kind.CHILD_RESULT]
    call_id: str
    name: str | None = None  # the tool's name
    child_id: uuid.UUID
    status: Literal["success", "error"]
    content: str
    attachments: list[dict[str, Any]] | None = None  # the parent's copies of the files the child returned
    started_at: datetime | None = None  # when the call was made: its log row's duration runs from it


class EffectInput(_Payload):
    """A due effect (`app/effects.py`), consumed when its handler finished."""

    kind: Literal[Kind.EFFECT]
    effect_id: uuid.UUID
    name: str | None = None


Payload = Annotated[
    MessageInput | ContinueInput | ToolInput | SpawnInput | ChildResultInput | EffectInput,
    Field(discriminator="kind"),
]
_PAYLOAD: TypeAdapter[Payload] = TypeAdapter(Payload)


def read(kind: str, payload: dict[str, Any]) -> Payload:
    """An inbox row's payload as the model of its kind; `ValueError`, saying what is wrong in one line, when it is
    not one."""
    try:
        return _PAYLOAD.validate_python({**payload, "kind": kind})
    except ValidationError as exc:
        wrong = errors.problems(({**e, "loc": e["loc"][1:]} for e in exc.errors()), whole="kind")  # [0]: the kind
        raise ValueError(wrong) from None
