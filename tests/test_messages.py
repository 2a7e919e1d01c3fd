"""Messages (`app/messages.py`) on real Postgres: session in, rows out; the test owns each transaction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import errors, events, keys, messages, tables, threads
from app.spec import define_agent
from app.spec.definitions import Side

AGENT = define_agent(name="helper", side_a={"prompt": "p"})


async def new_thread(session: AsyncSession) -> tables.Thread:
    return await threads.create(session, AGENT, keys.OPEN)


async def event_log(session: AsyncSession, thread_id: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in await events.read(session, thread_id, 0)]


def contents(rows: list[tables.Message]) -> list[str | None]:
    return [r.content for r in rows]


# -- sides and roles --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "tool_side", "side"),
    [("assistant", None, "a"), ("user", None, "b"), ("tool", "b", "b"), ("tool", None, None), ("system", "a", None)],
)
def test_the_side_follows_the_role_and_a_tool_result_its_call(role: str, tool_side: Side | None, side: str) -> None:
    assert messages.side_of(role, tool_side) == side


def test_what_a_side_writes_is_stored_under_its_role() -> None:
    assert [messages.role_of(s) for s in ("a", "b")] == ["assistant", "user"]
    assert all(messages.side_of(messages.role_of(s)) == s for s in ("a", "b"))  # the two agree


# -- add / save / get -------------------------------------------------------------------------------------


async def test_add_stores_and_announces_the_message(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        row = await messages.add(s, thread.id, "assistant", content="hello", metadata_={"k": 1})
    assert (row.side, row.status, row.depth, row.silent) == ("a", "completed", 0, False)  # database defaults read back
    assert row.position > 0
    async with sessions() as s:
        stored = await messages.get(s, thread.id, row.id)
        assert (stored.content, stored.metadata_) == ("hello", {"k": 1})
        ((kind, data),) = await event_log(s, thread.id)
    assert kind == "message_data"
    assert (data["message_id"], data["depth"]) == (str(row.id), 0)
    assert data["data"] == messages.to_dict(stored)


async def test_add_keeps_a_given_id_and_side(sessions: async_sessionmaker[AsyncSession]) -> None:
    given = uuid.uuid4()
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        row = await messages.add(s, thread.id, "tool", id=given, side="b", tool_call_id="c1", content="r")
    assert (row.id, row.side) == (given, "b")


async def test_messages_are_ordered_by_position_as_added(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        for i in range(3):
            await messages.add(s, thread.id, "user", content=f"m{i}", session_number=i % 2)
    async with sessions() as s:
        assert contents(await messages.history(s, thread.id)) == ["m0", "m1", "m2"]
        assert contents(await messages.history(s, thread.id, session_number=0)) == ["m0", "m2"]
        assert contents(await messages.history(s, thread.id, session_number=5)) == []


async def test_save_updates_the_row_and_announces_it_again(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        row = await messages.add(s, thread.id, "assistant", status="pending")
        created = row.updated_at
        await messages.save(s, row, status="completed", content="done")
    async with sessions() as s:
        stored = await messages.get(s, thread.id, row.id)
        assert (stored.status, stored.content) == ("completed", "done")
        assert stored.updated_at > created
        announced = [d["data"]["status"] for t, d in await event_log(s, thread.id) if t == "message_data"]
    assert announced == ["pending", "completed"]


async def test_a_later_save_is_written_with_the_transaction(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        row = await messages.add(s, thread.id, "assistant", status="pending")
        await messages.save(s, row, later=True, status="completed", content="deferred")
    async with sessions() as s:
        stored = await messages.get(s, thread.id, row.id)
    assert (stored.status, stored.content) == ("completed", "deferred")


async def test_a_later_add_announces_the_row_the_database_stores(sessions: async_sessionmaker[AsyncSession]) -> None:
    """`add(later=True)` reads nothing back: the columns it sets in Python (`_defaults`) must be what the table's own
    defaults would have given, or the announced message and the engine's held copy differ from the stored row."""
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        early = await messages.add(s, thread.id, "assistant", content="read back")
        later = await messages.add(s, thread.id, "assistant", later=True, content="not read back")
        announced = messages.to_dict(later)
    async with sessions() as s:
        stored_early = await messages.get(s, thread.id, early.id)
        stored_later = await messages.get(s, thread.id, later.id)
        assert announced == messages.to_dict(stored_later)
    skip = {"id", "content", "position", "rev", "created_at", "updated_at"}
    columns = [a.key for a in sa_inspect(tables.Message).column_attrs if a.key not in skip]
    assert {c: getattr(stored_later, c) for c in columns} == {c: getattr(stored_early, c) for c in columns}
    assert stored_later.position > stored_early.position


async def test_get_finds_a_message_only_in_its_own_thread(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread, other = await new_thread(s), await new_thread(s)
        row = await messages.add(s, thread.id, "user", content="hi")
    async with sessions() as s:
        with pytest.raises(errors.MessageNotFound, match=str(row.id)):
            await messages.get(s, other.id, row.id)


def test_to_dict_gives_ids_and_times_as_text() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    parent, child = uuid.uuid4(), uuid.uuid4()
    row = tables.Message(
        id=uuid.uuid4(), role="user", side="b", parent_id=parent, subagent_id=child, created_at=now, metadata_={}
    )
    data = messages.to_dict(row)
    assert (data["parent_id"], data["subagent_id"]) == (str(parent), str(child))
    assert data["created_at"] == "2026-01-02T03:04:05+00:00"
    assert data["metadata"] == {}
    assert "position" not in data and "rev" not in data  # internal columns stay internal


async def test_a_message_speaking_for_a_child_is_announced_with_the_child(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        thread, stranger = await new_thread(s), await new_thread(s)
        child = tables.Thread(
            id=uuid.uuid4(), agent="helper", type="ai_human", user_id=thread.user_id, parent_id=thread.id, name="kid"
        )
        s.add(child)
        await s.flush()
        await messages.add(s, thread.id, "user", content="from child", subagent_id=child.id)
        await messages.add(s, thread.id, "user", content="claims a stranger", subagent_id=stranger.id)
    async with sessions() as s:
        first, second = [d["data"] for _, d in await event_log(s, thread.id)]
    assert first["subagent_id"] == str(child.id)
    assert first["subagent_thread_name"] == "kid"
    assert "subagent_status" in first
    assert not any(k.startswith("subagent_") and k != "subagent_id" for k in second)  # not a child: no projection


# -- remove -----------------------------------------------------------------------------------------------


async def test_removing_a_tool_call_removes_its_results(sessions: async_sessionmaker[AsyncSession]) -> None:
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "t", "arguments": "{}"}} for i in (1, 2)]
    async with sessions() as s, s.begin():
        thread, other = await new_thread(s), await new_thread(s)
        call = await messages.add(s, thread.id, "assistant", tool_calls=calls)
        results = [await messages.add(s, thread.id, "tool", tool_call_id=c["id"], content="r") for c in calls]
        kept = await messages.add(s, thread.id, "assistant", content="after")
        elsewhere = await messages.add(s, other.id, "tool", tool_call_id="c1", content="another thread's")
        gone = await messages.remove(s, thread.id, call.id)
    assert set(gone) == {call.id, *(r.id for r in results)}
    async with sessions() as s:
        assert [r.id for r in await messages.history(s, thread.id)] == [kept.id]
        assert [r.id for r in await messages.history(s, other.id)] == [elsewhere.id]
        assert (await s.get_one(tables.Thread, thread.id)).messages_removed == 1
        deleted = {d["message_id"] for t, d in await event_log(s, thread.id) if t == "message_deleted"}
    assert deleted == {str(i) for i in gone}


async def test_removing_an_unknown_message_changes_nothing(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        other = await new_thread(s)
        row = await messages.add(s, other.id, "user", content="not yours")
        assert await messages.remove(s, thread.id, row.id) == []
    async with sessions() as s:
        assert (await s.get_one(tables.Thread, thread.id)).messages_removed == 0
        assert len(await messages.history(s, other.id)) == 1


# -- enqueue ----------------------------------------------------------------------------------------------


async def test_enqueue_queues_the_input_and_marks_an_idle_thread_queued(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        message_id = await messages.enqueue(s, thread, "user", "hi", silent=True, metadata={"subagent_id": "x"})
    async with sessions() as s:
        (inbox,) = (await s.execute(select(tables.Inbox).where(tables.Inbox.thread_id == thread.id))).scalars()
        stored = await s.get_one(tables.Thread, thread.id)
        log = await event_log(s, thread.id)
        assert await messages.history(s, thread.id) == []  # delivery stores it, not enqueue
    assert inbox.kind == "message"
    assert inbox.payload["id"] == str(message_id)
    assert (inbox.payload["content"], inbox.payload["silent"]) == ("hi", True)
    assert (inbox.payload["metadata"], inbox.payload["attachments"]) == ({"subagent_id": "x"}, [])
    assert stored.status == "queued" and stored.runnable_since is not None
    assert log == [("thread_status", {"status": "queued"})]


async def test_enqueue_leaves_a_running_thread_running(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        await threads.set_status(s, thread, threads.Status.RUNNING)
        first = await messages.enqueue(s, thread, "user", "one")
        second = await messages.enqueue(s, thread, "user", "two")
    assert first != second
    async with sessions() as s:
        assert (await s.get_one(tables.Thread, thread.id)).status == "running"
        assert [t for t, _ in await event_log(s, thread.id)] == ["thread_status"]  # only the change to running


async def test_a_terminated_thread_takes_no_input(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        thread.terminated_at = datetime.now(UTC)
        with pytest.raises(errors.ThreadTerminated):
            await messages.enqueue(s, thread, "user", "hi")


# -- changed ----------------------------------------------------------------------------------------------


# -- page -------------------------------------------------------------------------------------------------


async def paged_thread(sessions: async_sessionmaker[AsyncSession]) -> tuple[uuid.UUID, list[tables.Message]]:
    """A thread with m0..m4, a silent s and a nested d (depth 1), in that order."""
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        rows = [await messages.add(s, thread.id, "user", content=f"m{i}") for i in range(5)]
        rows.append(await messages.add(s, thread.id, "user", content="s", silent=True))
        rows.append(await messages.add(s, thread.id, "user", content="d", depth=1))
    return thread.id, rows


async def test_a_page_is_the_newest_messages_in_the_order_asked(sessions: async_sessionmaker[AsyncSession]) -> None:
    tid, _ = await paged_thread(sessions)
    async with sessions() as s:
        rows, cursor = await messages.page(s, tid, limit=2)
        assert contents(rows) == ["m3", "m4"] and cursor is not None
        rows, _ = await messages.page(s, tid, limit=2, order="desc")
        assert contents(rows) == ["m4", "m3"]


async def test_cursors_walk_back_through_every_message_once(sessions: async_sessionmaker[AsyncSession]) -> None:
    tid, _ = await paged_thread(sessions)
    seen: list[str | None] = []
    cursor: str | None = None
    async with sessions() as s:
        for _ in range(4):
            rows, cursor = await messages.page(s, tid, limit=2, cursor=cursor)
            seen = contents(rows) + seen
            if cursor is None:
                break
    assert seen == ["m0", "m1", "m2", "m3", "m4"]


async def test_silent_and_nested_messages_are_shown_only_when_asked(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    tid, _ = await paged_thread(sessions)
    async with sessions() as s:
        assert contents((await messages.page(s, tid))[0]) == ["m0", "m1", "m2", "m3", "m4"]
        assert contents((await messages.page(s, tid, include_silent=True))[0])[-1] == "s"
        assert contents((await messages.page(s, tid, include_silent=True, depth=1))[0])[-2:] == ["s", "d"]
        assert "d" in contents((await messages.page(s, tid, depth=1))[0])


async def test_since_id_pages_forward_without_a_cursor(sessions: async_sessionmaker[AsyncSession]) -> None:
    tid, rows = await paged_thread(sessions)
    async with sessions() as s:
        after, cursor = await messages.page(s, tid, limit=2, since_id=rows[1].id)
        assert contents(after) == ["m2", "m3"]
        assert cursor is None  # the next page is asked from the last message seen
        with pytest.raises(errors.MessageNotFound):
            await messages.page(s, tid, since_id=uuid.uuid4())


@pytest.mark.parametrize("cursor", ["abc", "0", "-5", str(2**62)])
async def test_a_cursor_that_is_no_position_is_refused(sessions: async_sessionmaker[AsyncSession], cursor: str) -> None:
    async with sessions() as s:
        with pytest.raises(errors.BadCursor):
            await messages.page(s, uuid.uuid4(), cursor=cursor)


# -- of_turn ----------------------------------------------------------------------------------------------


async def test_of_turn_keeps_the_silent_input_but_no_other_silent_message(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        first = await messages.add(s, thread.id, "user", content="silent input", silent=True)
        quiet = await messages.add(s, thread.id, "assistant", content="silent note", silent=True)
        answer = await messages.add(s, thread.id, "assistant", content="answer")
        outside = await messages.add(s, thread.id, "assistant", content="not asked for")
    async with sessions() as s:
        rows = await messages.of_turn(s, thread.id, [answer.id, quiet.id, first.id], first.id)
    assert [r.id for r in rows] == [first.id, answer.id]
    assert outside.id not in [r.id for r in rows]
