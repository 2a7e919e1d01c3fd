"""The frames of the two event streams in the OpenAPI document, made from the tables of `app.event_types`.

Each event type is a component of its own (`MessageDataEvent`: the frame's `event`, `id` and decoded `data`), its
payload a component named by its `TypedDict` (`MessageDataPayload`), and each stream's frames a union
(`ThreadEvent`, `LifecycleEvent`) discriminated by `event`: an event type added to a table is in the document.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from app import event_types

THREAD = "ThreadEvent"
LIFECYCLE = "LifecycleEvent"
STREAMS: dict[str, dict[str, type]] = {THREAD: event_types.THREAD_EVENTS, LIFECYCLE: event_types.LIFECYCLE_EVENTS}
# never stored, so never given an `id`: live deltas, and the stream's own note that part of the log is gone
UNSTORED = frozenset(event_types.THREAD_EVENTS.keys() - event_types.STORED.keys())
_REF = "#/components/schemas/{model}"

DESCRIPTION = (
    "Server-Sent Events (`text/event-stream`); the response does not end by itself. Each event is a frame of lines, "
    "then a blank line:\n\n"
    "```text\nid: 42\nevent: tool_completed\n"
    'data: {"tool": "calculate", "tool_call_id": "call_1", "status": "success"}\n```\n\n'
    "`id` is the event's seq (absent on the live-only `message_chunk` and `reasoning_chunk` and on `events_missed`), "
    "`event` its type, `data` its payload as one line of JSON. The schema describes a frame as an object of those "
    "three fields with `data` decoded; each event type is a component of its own. To resume after a dropped "
    "connection, send the last `id` seen as `Last-Event-ID` (or as `?since=`; the header wins): the stored events "
    "after it are replayed, then live ones follow, with no gap and no duplicate. When the resume point is older than "
    "the retention, `events_missed` comes first. A comment line (`: ping - <time>`) keeps the connection alive every "
    "15 s. Browsers' `EventSource` cannot send `Authorization`: pass `?token=` from `POST /stream-tokens` instead."
)


def name(event: str) -> str:
    """The component of an event type's frame: `message_data` is `MessageDataEvent`."""
    return "".join(part.capitalize() for part in event.split("_")) + "Event"


def ref(component: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=component)}


def response(stream: str) -> dict[str, Any]:
    """A stream route's 200: `stream` (`THREAD` or `LIFECYCLE`) names the union of its frames."""
    return {"description": DESCRIPTION, "content": {"text/event-stream": {"schema": ref(stream)}}}


def components() -> dict[str, dict[str, Any]]:
    """Every event type's frame, each payload, and the two unions; `ValueError` if one event type has two payloads
    in the tables, or two payloads one name."""
    found: dict[str, dict[str, Any]] = {}
    for stream, table in STREAMS.items():
        mapping: dict[str, str] = {}
        for event, payload in table.items():
            frame = _frame(event, _payload(payload, found))
            if found.setdefault(name(event), frame) != frame:
                raise ValueError(f"the event type `{event}` has two payloads in app/event_types.py")
            mapping[event] = ref(name(event))["$ref"]
        found[stream] = {
            "title": stream,
            "description": f"A frame of `GET {'/events' if stream == LIFECYCLE else '/threads/{thread_id}/events'}`.",
            "oneOf": [{"$ref": target} for target in mapping.values()],
            "discriminator": {"propertyName": "event", "mapping": mapping},
        }
    return found


def _payload(payload: type, found: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The reference to `payload`'s component, added to `found` with the definitions it uses."""
    schema = TypeAdapter(payload).json_schema(ref_template=_REF)
    component = f"{payload.__name__}Payload"
    schema["title"] = component  # generators name classes by title: `Error` and `SubagentEntry` are API schemas too
    for key, definition in {**schema.pop("$defs", {}), component: schema}.items():
        if found.setdefault(key, definition) != definition:
            raise ValueError(f"two schemas named `{key}` among the event payloads")
    return ref(component)


def _frame(event: str, data: dict[str, str]) -> dict[str, Any]:
    properties: dict[str, Any] = {"event": {"type": "string", "const": event}}
    required = ["event", "data"]
    if event not in UNSTORED:
        properties["id"] = {
            "type": "string",
            "pattern": "^[0-9]+$",
            "description": "the event's seq: send the last one seen as `Last-Event-ID` to resume after it",
        }
        required.insert(1, "id")
    properties["data"] = data
    stored = "stored, so replayed on resume" if event not in UNSTORED else "never stored: it has no `id`"
    return {
        "type": "object",
        "title": name(event),
        "description": f"`{event}` ({stored}; docs/events.md says when it is sent).",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
