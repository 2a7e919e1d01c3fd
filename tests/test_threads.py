"""Threads (`app/threads.py`) on real Postgres: session in, rows out; the test owns each transaction."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import errors, events, keys, tables, threads
from app.spec import define_agent

AGENT = define_agent(name="helper", side_a={"prompt": "p"})
DUAL = define_agent(name="duo", type="dual_ai", side_a={"prompt": "p"}, side_b={"prompt": "q"})
ALICE = keys.Principal(user_id="alice")
BOB = keys.Principal(user_id="bob")
ADMIN = keys.Principal(user_id="ops", admin=True)


async def event_log(session: AsyncSession, thread_id: uuid.UUID) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in await events.read(session, thread_id, 0)]


async def child_of(session: AsyncSession, parent: tables.Thread) -> tables.Thread:
    row = tables.Thread(
        id=uuid.uuid4(), agent="helper", type="ai_human", user_id=parent.user_id, parent_id=parent.id, root_id=parent.id
    )
    session.add(row)
    await session.flush()
    return row


# -- create / get / lock ----------------------------------------------------------------------------------


async def test_create_makes_an_idle_root_thread_of_the_agent(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        row = await threads.create(s, DUAL, ALICE, name="chat", tags=["x", "y"])
    assert (row.agent, row.type, row.user_id, row.name, row.tags) == ("duo", "dual_ai", "alice", "chat", ["x", "y"])
    assert (row.root_id, row.parent_id, row.status, row.session_number) == (row.id, None, "idle", 0)
    assert row.created_at is not None  # refreshed: the database's defaults are loaded
    async with sessions() as s:
        assert await event_log(s, row.id) == []  # creating announces nothing on the thread


async def test_create_without_tags_stores_an_empty_list(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        row = await threads.create(s, AGENT, ALICE)
    async with sessions() as s:
        assert (await s.get_one(tables.Thread, row.id)).tags == []


async def test_get_finds_the_owners_thread_and_hides_it_from_others(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        row = await threads.create(s, AGENT, ALICE)
    async with sessions() as s:
        assert (await threads.get(s, row.id, ALICE)).id == row.id
        assert (await threads.get(s, row.id, ADMIN)).id == row.id  # an admin sees every thread
        with pytest.raises(errors.ThreadNotFound, match=str(row.id)):
            await threads.get(s, row.id, BOB)
        with pytest.raises(errors.ThreadNotFound):
            await threads.get(s, uuid.uuid4(), ADMIN)


async def nowait(sessions: async_sessionmaker[AsyncSession], thread_id: uuid.UUID, mode: str) -> bool:
    """Whether another connection can take the row lock `mode` at once."""
    async with sessions() as other, other.begin():
        try:
            await other.execute(text(f"SELECT 1 FROM threads WHERE id = :id FOR {mode} NOWAIT"), {"id": thread_id})
        except DBAPIError:
            return False
    return True


async def test_get_with_lock_holds_the_row_but_lets_key_share_through(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        row = await threads.create(s, AGENT, ALICE)
    async with sessions() as s, s.begin():
        await threads.get(s, row.id, ALICE, lock=True)
        assert not await nowait(sessions, row.id, "UPDATE")
        assert await nowait(sessions, row.id, "KEY SHARE")  # a child's foreign key check is not blocked
    async with sessions() as s, s.begin():
        await threads.get(s, row.id, ALICE)
        assert await nowait(sessions, row.id, "UPDATE")  # without `lock`, a plain read


async def test_lock_locks_the_row_and_refuses_an_unknown_thread(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        row = await threads.create(s, AGENT, ALICE)
    async with sessions() as s, s.begin():
        assert (await threads.lock(s, row.id)).id == row.id
        assert not await nowait(sessions, row.id, "NO KEY UPDATE")
        with pytest.raises(errors.ThreadNotFound):
            await threads.lock(s, uuid.uuid4())


# -- list_ ------------------------------------------------------------------------------------------------


async def test_list_shows_a_user_their_own_threads_and_an_admin_all(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as s, s.begin():
        mine = await threads.create(s, AGENT, ALICE)
        theirs = await threads.create(s, AGENT, BOB)
    async with sessions() as s:
        assert [r.id for r in (await threads.list_(s, ALICE))[0]] == [mine.id]
        assert {r.id for r in (await threads.list_(s, ADMIN))[0]} == {mine.id, theirs.id}


async def test_list_filters_by_agent_tag_status_and_parent(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        tagged = await threads.create(s, AGENT, ALICE, tags=["red", "blue"])
        duo = await threads.create(s, DUAL, ALICE)
        child = await child_of(s, tagged)
        await threads.set_status(s, duo, threads.Status.QUEUED)
    async with sessions() as s:

        async def ids(**filters: Any) -> set[uuid.UUID]:
            return {r.id for r in (await threads.list_(s, ALICE, **filters))[0]}

        assert await ids(agent="duo") == {duo.id}
        assert await ids(tag="blue") == {tagged.id}
        assert await ids(tag="green") == set()
        assert await ids(status="queued") == {duo.id}
        assert await ids(parent_id="none") == {tagged.id, duo.id}
        assert await ids(parent_id=tagged.id) == {child.id}
        assert await ids() == {tagged.id, duo.id, child.id}


async def test_list_pages_newest_first_with_ties_broken_by_id(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():  # one transaction: every row has the same `created_at`
        made = [(await threads.create(s, AGENT, ALICE)).id for _ in range(5)]
    seen: list[uuid.UUID] = []
    cursor: str | None = None
    async with sessions() as s:
        for _ in range(3):
            rows, cursor = await threads.list_(s, ALICE, limit=2, cursor=cursor)
            seen += [r.id for r in rows]
            if cursor is None:
                break
    assert seen == sorted(made, reverse=True)  # each once, none skipped
    assert cursor is None


async def test_a_full_last_page_has_no_next_cursor(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        for _ in range(2):
            await threads.create(s, AGENT, ALICE)
    async with sessions() as s:
        rows, cursor = await threads.list_(s, ALICE, limit=2)
    assert len(rows) == 2 and cursor is None


async def test_list_refuses_a_cursor_it_did_not_give_out(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s:
        with pytest.raises(errors.BadCursor):
            await threads.list_(s, ALICE, cursor="not-a-cursor")


# -- children_counts --------------------------------------------------------------------------------------


async def test_children_counts_counts_direct_children_only(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        parent = await threads.create(s, AGENT, ALICE)
        lonely = await threads.create(s, AGENT, ALICE)
        first = await child_of(s, parent)
        await child_of(s, parent)
        await child_of(s, first)  # a grandchild counts for its own parent
        counts = await threads.children_counts(s, [parent.id, lonely.id, first.id])
        assert counts == {parent.id: 2, first.id: 1}  # no entry for a thread without children
        assert await threads.children_counts(s, []) == {}


# -- status and sessions ----------------------------------------------------------------------------------


async def test_set_status_announces_a_change_once(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        row = await threads.create(s, AGENT, ALICE)
        before = row.updated_at
        await threads.set_status(s, row, threads.Status.IDLE)  # no change: nothing written
        await threads.set_status(s, row, threads.Status.QUEUED)
        await threads.set_status(s, row, threads.Status.QUEUED)
        await threads.set_status(s, row, threads.Status.RUNNING)
    async with sessions() as s:
        stored = await s.get_one(tables.Thread, row.id)
        assert stored.status == "running" and stored.updated_at > before
        assert await event_log(s, row.id) == [
            ("thread_status", {"status": "queued"}),
            ("thread_status", {"status": "running"}),
        ]


async def test_end_session_records_how_it_ended(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        with_result = await threads.create(s, AGENT, ALICE)
        without = await threads.create(s, AGENT, ALICE)
        with_result.side, without.side = "b", "a"
        await threads.end_session(
            s, with_result, threads.SessionStatus.SUCCESS, "session_stop", {"content": "done", "attachments": []}
        )
        await threads.end_session(s, without, threads.SessionStatus.FAILURE, "llm_error")
    async with sessions() as s:
        stored = await s.get_one(tables.Thread, with_result.id)
        assert (stored.session_status, stored.session_reason, stored.side) == ("success", "session_stop", None)
        assert stored.session_result == {"content": "done", "attachments": []}
        assert await event_log(s, with_result.id) == [
            (
                "session_ended",
                {"status": "success", "reason": "session_stop", "result": {"content": "done", "attachments": []}},
            )
        ]
        assert await event_log(s, without.id) == [("session_ended", {"status": "failure", "reason": "llm_error"})]
        assert (await s.get_one(tables.Thread, without.id)).session_result is None
