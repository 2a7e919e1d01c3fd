"""The history as the acting side's prompt sees it (§4), and a worker's copy of it kept between steps.

`history` turns the thread's messages into the model's: the acting side's own as `assistant`, the other side's as
`user`, the other side's tool traffic left out, and only complete call/result pairs. A step's request holds the whole
history, so building it anew at every step would make a step of a 1,000-message thread cost far more than one of a
10-message thread. A `Transcript` (one per held history, `history.History`) keeps the messages it made from the
*settled* rows at the head of the history — no longer pending, their tool calls all answered — and at the next step
makes only those of the rows after them. It uses them only when the same rows still lead the history (the held rows
are frozen copies, `history.Seen`, replaced when a row changes) and nothing after them answers one of their calls;
otherwise it starts again from the first row. Either way its messages are those `history` makes: the tests hold
the two to each other.

The messages are shared between requests: nothing may change one in place (`calls.inline_images` and `build_request`
replace a message whose images they change).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from app import messages
from app.spec.definitions import PromptDefinition, Side
from app.spec.messages import LLMImage, LLMMessage, ToolCall


class HistoryRow(Protocol):
    """What building a request reads of a message: an ORM row, or its plain copy (`history.Seen`)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def position(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def side(self) -> Side | None: ...
    @property
    def status(self) -> str: ...
    @property
    def depth(self) -> int: ...
    @property
    def content(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[Any] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def attachments(self) -> list[Any]: ...
    @property
    def prompt(self) -> str | None: ...
    @property
    def reasoning_content(self) -> str | None: ...
    @property
    def reasoning_details(self) -> list[Any] | None: ...


Row = TypeVar("Row", bound=HistoryRow)


def visible(row: HistoryRow, side: Side, prompt: PromptDefinition, turn_start: int) -> bool:
    """Whether the side's prompt may see the row: a completed one of its chat window (§4)."""
    if row.status != messages.Status.COMPLETED or row.depth != 0:
        return False
    if row.position < turn_start and not prompt.include_chat:
        return False
    return not (row.role == "tool" and row.side != side)


def visible_rows(rows: Sequence[Row], side: Side, prompt: PromptDefinition, turn_start: int) -> list[Row]:
    """The rows a side's prompt may see (`visible`)."""
    return [row for row in rows if visible(row, side, prompt, turn_start)]


MAX_IMAGE_BYTES = 5 * 1024 * 1024  # larger images are named, not sent (providers refuse bigger inline images)


def described(text: str | None, attachments: list[dict[str, Any]] | None) -> str:
    """A message's text with its attachments named, so a model that sees no image still knows the files exist."""
    if not attachments:
        return text or ""
    lines = []
    for a in attachments:
        facts = [str(a.get("mime_type") or "file"), f"{a.get('size', 0)} bytes"]
        if a.get("width") and a.get("height"):
            facts.append(f"{a['width']}x{a['height']}")
        lines.append(f"- {a.get('path')} ({', '.join(facts)})")
    note = "Attached files:\n" + "\n".join(lines)
    return f"{text}\n\n{note}" if text else note


def images(attachments: list[dict[str, Any]] | None) -> list[LLMImage]:
    """The attachments a model may be shown as images."""
    return [
        LLMImage(mime_type=str(a["mime_type"]), path=str(a["path"]))
        for a in attachments or []
        if str(a.get("mime_type", "")).startswith("image/")
        and "svg" not in str(a.get("mime_type"))
        and int(a.get("size") or 0) <= MAX_IMAGE_BYTES
        and a.get("path")
    ]


def history(rows: Sequence[HistoryRow], side: Side, prompt: PromptDefinition, turn_start: int) -> list[LLMMessage]:
    """The history in the acting side's perspective: its own messages as `assistant`, the other side's as
    `user`, the other side's tool traffic left out, and only complete call/result pairs. Attachments are named
    in the text; image attachments of `user` messages are also carried as images (see `build_request`)."""
    return Transcript().history(rows, side, prompt, turn_start)


@dataclass
class _Made:
    """Messages made from the rows at the head of the history, with what making the rest needs."""

    turn_start: int
    rows: list[HistoryRow] = field(default_factory=list)
    messages: list[LLMMessage] = field(default_factory=list)
    images: list[int] = field(default_factory=list)  # indexes into `messages` of those carrying images
    results: dict[str | None, HistoryRow] = field(default_factory=dict)  # their visible tool results, by call
    calls: set[str] = field(default_factory=set)  # the calls among `rows` whose results were looked up


class Transcript:
    """One thread's `history` in each perspective it was asked for, kept between steps (see the module)."""

    def __init__(self) -> None:
        self._made: dict[tuple[Side, str, bool, bool], _Made] = {}

    def history(
        self, rows: Sequence[HistoryRow], side: Side, prompt: PromptDefinition, turn_start: int
    ) -> list[LLMMessage]:
        return self.messages(rows, side, prompt, turn_start)[0]

    def messages(
        self, rows: Sequence[HistoryRow], side: Side, prompt: PromptDefinition, turn_start: int
    ) -> tuple[list[LLMMessage], list[int]]:
        """`history`'s messages (a new list) and the indexes of those that carry images. Only frozen rows may be
        kept between calls (`history.Seen`): a row changed in place would go unnoticed."""
        key = (side, prompt.name, prompt.include_chat, prompt.include_past_tools)
        made = self._made.get(key)
        if made is None or made.turn_start != turn_start or rows[: len(made.rows)] != made.rows:
            made = _Made(turn_start)
        tail = rows[len(made.rows) :]
        shown, results = _looked_at(tail, side, prompt, turn_start)
        if not made.calls.isdisjoint(results):  # a late result for a call made earlier: start again
            made, tail = _Made(turn_start), rows
            shown, results = _looked_at(tail, side, prompt, turn_start)
        earlier = made.results

        def result(call_id: str) -> HistoryRow | None:
            found = results.get(call_id)  # a later result of the same call wins, as in a fresh `history`
            return found if found is not None else earlier.get(call_id)

        out, with_images = list(made.messages), list(made.images)
        # the rows at the head of `tail` that are settled: how many, and the messages, images and calls made of them
        settling, settled, settled_out, settled_images, settled_calls = True, 0, len(out), len(with_images), []
        for row, seen in zip(tail, shown, strict=True):
            calls: list[str] = []
            answered = True
            if seen and row.role != "tool":
                answered = _add(row, side, prompt, turn_start, result, out, with_images, calls)
            settling = settling and answered and row.status != messages.Status.PENDING
            if settling:
                settled += 1
                settled_out, settled_images = len(out), len(with_images)
                settled_calls += calls
        if settled:
            head = zip(tail[:settled], shown[:settled], strict=True)
            made.results.update((row.tool_call_id, row) for row, seen in head if seen and row.role == "tool")
            made.calls.update(settled_calls)
            made.messages += out[len(made.messages) : settled_out]
            made.images += with_images[len(made.images) : settled_images]
            made.rows += tail[:settled]
        self._made[key] = made
        return out, with_images


def _looked_at(
    rows: Sequence[HistoryRow], side: Side, prompt: PromptDefinition, turn_start: int
) -> tuple[list[bool], dict[str | None, HistoryRow]]:
    """Whether each row is `visible`, and the visible tool results by call (the last of a call wins)."""
    shown = [visible(row, side, prompt, turn_start) for row in rows]
    results = {row.tool_call_id: row for row, seen in zip(rows, shown, strict=True) if seen and row.role == "tool"}
    return shown, results


def _add(
    row: HistoryRow,
    side: Side,
    prompt: PromptDefinition,
    turn_start: int,
    result: Callable[[str], HistoryRow | None],
    out: list[LLMMessage],
    with_images: list[int],
    calls: list[str],
) -> bool:
    """Append a visible row's messages to `out` (a call's result right after it, even when a message was injected
    while the tools ran); `calls` gets the ids of the calls whose results were looked up. Whether all were found."""
    if row.role == "system":
        out.append(LLMMessage("system", row.content or ""))
        return True
    if row.side != side:
        if row.content or row.attachments:
            shown = images(row.attachments)
            if shown:
                with_images.append(len(out))
            out.append(LLMMessage("user", described(row.content, row.attachments), images=shown))
        return True
    pairs: list[tuple[ToolCall, HistoryRow]] = []
    answered = True
    if row.position >= turn_start or prompt.include_past_tools:
        for call in row.tool_calls or []:
            calls.append(call["id"])
            found = result(call["id"])
            if found is None:
                answered = False
            else:
                pairs.append((call, found))
    if row.content or pairs:
        message = LLMMessage("assistant", row.content or None, tool_calls=[c for c, _ in pairs] or None)
        if row.prompt == prompt.name:  # reasoning goes back only to the prompt that produced it
            message.reasoning, message.reasoning_details = row.reasoning_content, row.reasoning_details
        out.append(message)
    for _, found in pairs:
        content = described(found.content, found.attachments)
        out.append(LLMMessage("tool", content, tool_call_id=found.tool_call_id, name=found.name))
    return answered
