"""The history as a side's prompt sees it (`app/engine/transcript.py`): the perspective flip, what is left out, and a
thread's `Transcript` kept between steps, held to a fresh `history` over random histories. No database."""

from __future__ import annotations

import dataclasses
import itertools
import random
import uuid
from typing import Any

import pytest

from app.engine import transcript
from app.engine.history import Seen
from app.spec import define_prompt
from app.spec.definitions import PromptDefinition, Side
from app.spec.messages import ToolCall


def prompt(name: str = "p", **fields: Any) -> PromptDefinition:
    return define_prompt(**{"name": name, "model": "m", "prompt": "You are terse.", **fields})


# -- history: the perspective flip ------------------------------------------------------------------------

_ids = itertools.count(1)


def row(role: str, content: str | None = None, side: str | None = None, **fields: Any) -> Seen:
    values: dict[str, Any] = {
        "id": uuid.uuid4(),
        "position": next(_ids) * 10,
        "role": role,
        "side": side if side is not None else {"assistant": "a", "user": "b"}.get(role),
        "status": "completed",
        "depth": 0,
        "content": content,
        "name": None,
        "tool_calls": None,
        "tool_call_id": None,
        "attachments": [],
        "prompt": None,
        "reasoning_content": None,
        "reasoning_details": None,
    }
    values.update(fields)
    return Seen(**values)


def tool_call(call_id: str, name: str = "lookup") -> ToolCall:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def shown(messages: list[Any]) -> list[tuple[str, str | None]]:
    return [(m.role, m.content) for m in messages]


CHATTY = prompt("p", include_chat=True, include_past_tools=True)


def test_side_a_sees_its_messages_as_assistant_and_side_b_as_user() -> None:
    rows = [row("user", "question"), row("assistant", "answer")]
    assert shown(transcript.history(rows, "a", CHATTY, 0)) == [("user", "question"), ("assistant", "answer")]


def test_side_b_of_a_dual_ai_agent_sees_the_roles_flipped() -> None:
    rows = [row("user", "opening"), row("assistant", "from a"), row("user", "from b")]
    assert shown(transcript.history(rows, "b", CHATTY, 0)) == [
        ("assistant", "opening"),
        ("user", "from a"),
        ("assistant", "from b"),
    ]


def test_the_other_sides_tool_traffic_is_left_out() -> None:
    rows = [
        row("user", "go"),
        row("assistant", None, tool_calls=[tool_call("c1")]),
        row("tool", "result", side="a", tool_call_id="c1", name="lookup"),
        row("assistant", "done"),
    ]
    assert shown(transcript.history(rows, "b", CHATTY, 0)) == [("assistant", "go"), ("user", "done")]
    seen_by_a = transcript.history(rows, "a", CHATTY, 0)
    assert [m.role for m in seen_by_a] == ["user", "assistant", "tool", "assistant"]
    assert seen_by_a[2].tool_call_id == "c1" and seen_by_a[2].name == "lookup"


def test_a_tool_result_follows_its_call_even_when_input_arrived_while_it_ran() -> None:
    rows = [
        row("assistant", "checking", tool_calls=[tool_call("c1")]),
        row("user", "injected"),
        row("tool", "result", side="a", tool_call_id="c1"),
    ]
    assert shown(transcript.history(rows, "a", CHATTY, 0)) == [
        ("assistant", "checking"),
        ("tool", "result"),
        ("user", "injected"),
    ]


def test_a_call_without_its_result_is_not_sent() -> None:
    rows = [
        row("assistant", "partial", tool_calls=[tool_call("c1"), tool_call("c2")]),
        row("tool", "r1", side="a", tool_call_id="c1"),
    ]
    (assistant, result) = transcript.history(rows, "a", CHATTY, 0)
    assert [c["id"] for c in assistant.tool_calls or []] == ["c1"]
    assert result.content == "r1"


def test_past_turns_are_hidden_without_include_chat() -> None:
    old, new = row("user", "old"), row("user", "new")
    quiet = prompt("p", include_chat=False)
    assert shown(transcript.history([old, new], "a", quiet, new.position)) == [("user", "new")]
    assert shown(transcript.history([old, new], "a", CHATTY, new.position)) == [("user", "old"), ("user", "new")]


def test_past_tool_calls_are_dropped_without_include_past_tools() -> None:
    past = [
        row("assistant", None, tool_calls=[tool_call("c1")]),
        row("tool", "r1", side="a", tool_call_id="c1"),
        row("assistant", "said", tool_calls=[tool_call("c2")]),
        row("tool", "r2", side="a", tool_call_id="c2"),
    ]
    current = row("user", "now")
    plain = prompt("p", include_chat=True, include_past_tools=False)
    got = transcript.history([*past, current], "a", plain, current.position)
    assert shown(got) == [("assistant", "said"), ("user", "now")]  # the call-only message has nothing left
    assert got[0].tool_calls is None


def test_pending_failed_and_nested_messages_are_not_sent() -> None:
    rows = [
        row("user", "kept"),
        row("assistant", "streaming", status="pending"),
        row("assistant", "broken", status="failed"),
        row("assistant", "a child's", depth=1),
    ]
    assert shown(transcript.history(rows, "a", CHATTY, 0)) == [("user", "kept")]


def test_reasoning_goes_back_only_to_the_prompt_that_produced_it() -> None:
    rows = [
        row("assistant", "mine", prompt="p", reasoning_content="because", reasoning_details=[{"sig": "x"}]),
        row("assistant", "other", prompt="q", reasoning_content="elsewhere"),
    ]
    mine, other = transcript.history(rows, "a", CHATTY, 0)
    assert (mine.reasoning, mine.reasoning_details) == ("because", [{"sig": "x"}])
    assert other.reasoning is None


IMAGE = {"path": "/attachments/cat.png", "mime_type": "image/png", "size": 10, "width": 4, "height": 3}


def test_attachments_are_named_and_only_sendable_images_are_carried() -> None:
    big = {**IMAGE, "path": "/attachments/big.png", "size": transcript.MAX_IMAGE_BYTES + 1}
    svg = {**IMAGE, "path": "/attachments/x.svg", "mime_type": "image/svg+xml"}
    pdf = {"path": "/attachments/doc.pdf", "mime_type": "application/pdf", "size": 99}
    (message,) = transcript.history([row("user", "look", attachments=[IMAGE, big, svg, pdf])], "a", CHATTY, 0)
    assert [i.path for i in message.images] == ["/attachments/cat.png"]
    assert "- /attachments/cat.png (image/png, 10 bytes, 4x3)" in (message.content or "")
    assert "- /attachments/doc.pdf (application/pdf, 99 bytes)" in (message.content or "")


def test_described_without_text_is_the_note_alone() -> None:
    assert transcript.described(None, None) == ""
    assert transcript.described("hi", []) == "hi"
    assert transcript.described(None, [{"path": "/f"}]) == "Attached files:\n- /f (file, 0 bytes)"


# -- a thread's transcript, kept between steps -------------------------------------------------------------


def changed(seen: Seen, **fields: Any) -> Seen:
    """The held copy of a row after an update (`history.History` replaces it)."""
    return dataclasses.replace(seen, **fields)


PERSPECTIVES: list[tuple[Side, PromptDefinition]] = [
    ("a", CHATTY),
    ("b", CHATTY),
    ("a", prompt("p", include_chat=False, include_past_tools=False)),
    ("a", prompt("p", include_chat=True, include_past_tools=False)),
    ("a", prompt("q", include_chat=True, include_past_tools=True)),
]


class Thread:
    """A history written the ways the engine and the API write one, at random."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.rows: list[Seen] = []
        self.turn_start = 0
        self.unanswered: list[tuple[str, str]] = []  # (call id, side)
        self.calls = itertools.count()

    def grow(self) -> None:
        r = self.random
        kind = r.choice(["user", "user", "assistant", "assistant", "result", "result", "turn", "edit", "other"])
        if kind == "user":
            attachments = [IMAGE] if r.random() < 0.2 else []
            self.rows.append(row("user", f"u{len(self.rows)}", side=r.choice(["b", None]), attachments=attachments))
        elif kind == "assistant":
            side = r.choice(["a", "a", "b"])
            pending = row("assistant", None, side=side, status="pending", prompt=r.choice(["p", "q"]))
            self.rows.append(pending)
            if r.random() < 0.8:  # answered (else still streaming at the next step)
                ids = [f"c{next(self.calls)}" for _ in range(r.choice([0, 0, 1, 3]))]
                if ids and r.random() < 0.05 and self.unanswered:
                    ids[0] = self.unanswered[0][0]  # an id used before
                self.unanswered += [(i, side) for i in ids]
                content = r.choice([None, f"a{len(self.rows)}"]) if ids else f"a{len(self.rows)}"
                done = changed(pending, status="completed", content=content, tool_calls=[tool_call(i) for i in ids])
                self.rows[-1] = done
        elif kind == "result" and self.unanswered:
            call, side = self.unanswered.pop(r.randrange(len(self.unanswered)))
            self.rows.append(row("tool", f"r-{call}", side=side, tool_call_id=call, name="lookup"))
        elif kind == "turn" and self.rows:
            self.turn_start = self.rows[-1].position
        elif kind == "edit" and self.rows:
            at = r.randrange(len(self.rows))
            self.rows[at] = changed(self.rows[at], content=f"edited {at}", status="completed")
        elif kind == "other" and self.rows:
            at = r.randrange(len(self.rows))
            fate = r.choice(["failed", "nested", "deleted", "pending done", "system"])
            if fate == "failed":
                self.rows[at] = changed(self.rows[at], status="failed")
            elif fate == "nested":
                self.rows.append(row("assistant", "a child's", side="a", depth=1))
            elif fate == "deleted":
                del self.rows[at]
            elif fate == "pending done":
                waiting = [i for i, seen in enumerate(self.rows) if seen.status == "pending"]
                if waiting:
                    self.rows[waiting[0]] = changed(self.rows[waiting[0]], status="completed", content="late")
            else:
                self.rows.append(row("system", "note"))


@pytest.mark.parametrize("seed", range(40))
def test_a_kept_transcript_makes_what_a_fresh_history_makes(seed: int) -> None:
    thread = Thread(seed)
    kept = transcript.Transcript()
    for step in range(120):
        thread.grow()
        side, shown_to = PERSPECTIVES[thread.random.randrange(len(PERSPECTIVES))] if step % 7 == 0 else PERSPECTIVES[0]
        got = kept.messages(list(thread.rows), side, shown_to, thread.turn_start)
        assert got == transcript.Transcript().messages(list(thread.rows), side, shown_to, thread.turn_start), step


def test_a_step_makes_only_the_messages_of_new_rows() -> None:
    kept = transcript.Transcript()
    rows = [row("user", "go")]
    for i in range(5):
        call = row("assistant", None, tool_calls=[tool_call(f"k{i}")])
        rows += [call, row("tool", f"r{i}", side="a", tool_call_id=f"k{i}")]
    before = kept.history(rows, "a", CHATTY, 0)
    rows += [row("assistant", "done")]
    after = kept.history(rows, "a", CHATTY, 0)
    assert after[:-1] == before and all(a is b for a, b in zip(after, before, strict=False))  # the same objects
    assert after is not kept.history(rows, "a", CHATTY, 0)  # a new list each time: the caller may add to it
    rows[1] = changed(rows[1], content="edited")  # an update of an early row: made again
    assert kept.history(rows, "a", CHATTY, 0)[1].content == "edited"


@pytest.mark.parametrize("unsettled", ["streaming", "unanswered"])
def test_rows_that_will_change_are_made_again_without_the_rows_before_them(unsettled: str) -> None:
    """A pending answer, and a call whose result has not come, are left out of what is kept: when they change (as
    they will) the messages before them are not made again."""
    kept = transcript.Transcript()
    rows = [row("user", "go"), row("assistant", "hello"), row("user", "more")]
    if unsettled == "streaming":
        rows.append(row("assistant", None, status="pending"))
    else:
        rows.append(row("assistant", None, tool_calls=[tool_call("k")]))
    before = kept.history(rows, "a", CHATTY, 0)
    if unsettled == "streaming":
        rows[-1] = changed(rows[-1], status="completed", content="answer")
    else:
        rows.append(row("tool", "r", side="a", tool_call_id="k"))
    after = kept.history(rows, "a", CHATTY, 0)
    assert len(after) > len(before) and all(a is b for a, b in zip(after, before[:3], strict=False))


def test_a_late_result_for_an_earlier_call_is_placed_after_it() -> None:
    kept = transcript.Transcript()
    asked = row("assistant", None, tool_calls=[tool_call("late")])
    rows = [row("user", "go"), asked, row("user", "meanwhile")]
    assert shown(kept.history(rows, "a", CHATTY, 0)) == [("user", "go"), ("user", "meanwhile")]
    rows.append(row("tool", "there", side="a", tool_call_id="late"))
    assert shown(kept.history(rows, "a", CHATTY, 0)) == [
        ("user", "go"),
        ("assistant", None),
        ("tool", "there"),
        ("user", "meanwhile"),
    ]
