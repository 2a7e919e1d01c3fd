"""Examples on the main operations of the OpenAPI document: each is validated by the API's own model as the
document is built, so an example that stops matching its schema fails the build (and the tests), not a reader."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from app.api import schemas

THREAD_ID = "5b0f2c7e-3d4a-4e7b-9a51-6c2f0e8d1a93"
MISSING_ID = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"  # the 404's
_USER_MESSAGE_ID = "0e9c4b12-7f3a-4c8e-b1d2-5a6f7e8d9c01"
_REPLY_ID = "7d2e1f30-9a8b-4c6d-a5e4-3b2c1d0e9f12"
_AT = datetime(2026, 1, 15, 9, 30, tzinfo=UTC)

_THREAD = schemas.Thread(
    id=uuid.UUID(THREAD_ID),
    agent="assistant",
    origin_agent=None,
    type="ai_human",
    parent_id=None,
    user_id="alice",
    name="Support chat",
    tags=["support"],
    status="queued",
    side="a",
    session=schemas.Session(number=1, turns=0, status="running"),
    env={"LANGUAGE": "en"},
    env_types={"LANGUAGE": "text"},
    created_at=_AT,
    updated_at=_AT,
    last_message_at=_AT,
    terminated_at=None,
    children_count=0,
)


def _message(message_id: str, role: str, content: str) -> schemas.Message:
    return schemas.Message(
        id=uuid.UUID(message_id),
        role=role,
        side="a" if role == "assistant" else None,
        content=content,
        name=None,
        tool_calls=None,
        tool_call_id=None,
        tool_status=None,
        status="completed",
        silent=False,
        depth=0,
        parent_id=None,
        attachments=[],
        reasoning_content=None,
        metadata={},
        subagent_id=None,
        model="demo" if role == "assistant" else None,
        usage={"input_tokens": 12, "output_tokens": 8} if role == "assistant" else None,
        created_at=_AT,
    )


_MESSAGES = [
    _message(_USER_MESSAGE_ID, "user", "What is 6 times 7?"),
    _message(_REPLY_ID, "assistant", "6 times 7 is 42."),
]

# operation id -> (where, the model that must take it, the example); `where` is `request` or a response's status
Table = dict[str, list[tuple[str, type[BaseModel], dict[str, Any]]]]
EXAMPLES: Table = {
    "createThread": [
        ("request", schemas.ThreadIn, {"agent": "assistant", "name": "Support chat", "tags": ["support"],
                                       "env": {"LANGUAGE": "en"}, "messages": [{"content": "What is 6 times 7?"}]}),
        ("201", schemas.Thread, _THREAD.model_dump(mode="json")),
        ("422", schemas.Error, {"error": {
            "code": "invalid_request",
            "message": "Invalid request: agent: Field required",
            "details": {"problems": [{"field": "agent", "message": "Field required", "type": "missing"}]},
        }}),
    ],
    "getThread": [
        ("200", schemas.Thread, _THREAD.model_dump(mode="json")),
        ("404", schemas.Error, {"error": {"code": "thread_not_found", "message": f"Thread {MISSING_ID} not found"}}),
    ],
    "postMessage": [
        ("request", schemas.MessageIn, {"content": "What is 6 times 7?"}),
        ("202", schemas.Queued, {"message_id": _USER_MESSAGE_ID, "status": "queued"}),
        ("200", schemas.Turn, {
            "message_id": _USER_MESSAGE_ID, "done": True, "status": "idle", "outcome": "completed", "error": None,
            "messages": [m.model_dump(mode="json") for m in _MESSAGES],
        }),
        ("409", schemas.Error, {"error": {"code": "thread_terminated", "message": "Thread is terminated"}}),
    ],
    "listMessages": [
        ("200", schemas.MessageList, {"messages": [m.model_dump(mode="json") for m in _MESSAGES], "next_cursor": None}),
    ],
}  # fmt: skip
_WAIT = 30  # `POST .../messages?wait=30`: the turn's messages in the answer, within 30 s


def add(paths: dict[str, Any], table: Table = EXAMPLES) -> None:
    """Put the examples of `table` on their operations (after the error responses have their envelope); a
    `ValueError` if one does not fit its model."""
    operations = {op["operationId"]: op for item in paths.values() for op in item.values() if "operationId" in op}
    for operation_id, examples in table.items():
        operation = operations[operation_id]
        for where, model, value in examples:
            model.model_validate(value)
            if unknown := value.keys() - model.model_fields.keys():
                raise ValueError(
                    f"the example of {operation_id} ({where}) has fields {model.__name__} lacks: {unknown}"
                )
            place = operation["requestBody"] if where == "request" else operation["responses"][where]
            place["content"]["application/json"]["example"] = value
    for param in operations.get("postMessage", {}).get("parameters", []):
        if param["name"] == "wait":
            param["example"] = _WAIT
