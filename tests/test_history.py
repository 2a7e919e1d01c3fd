"""The history a worker keeps between steps and executions (`app/engine/history.py`), on real Postgres."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import changes, events, keys, messages, queue, statements, tables, threads
from app.engine.history import Histories, History
from app.spec import define_agent

AGENT = define_agent(name="a", side_a={"prompt": "p"})


async def _thread(sessions: async_sessionmaker[AsyncSession], n: int) -> uuid.UUID:
    async with sessions() as s, s.begin():
        thread = await threads.create(s, AGENT, keys.OPEN)
        for i in range(n):
            await messages.add(s, thread.id, "user", content=f"m{i}")
        return thread.id


async def _read(sessions: async_sessionmaker[AsyncSession], held: History, tid: uuid.UUID) -> list[str | None]:
    async with sessions() as s, s.begin():
        thread = await s.get_one(tables.Thread, tid, with_for_update={"key_share": True})
        return [r.content for r in await held.rows(s, thread)]


async def test_it_reads_only_what_was_written_since_and_sees_every_change(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    tid = await _thread(sessions, 3)
    held = History()
    assert await _read(sessions, held, tid) == ["m0", "m1", "m2"]
    async with sessions() as s, s.begin():
        [first] = [r for r in await messages.history(s, tid) if r.content == "m0"]
        await messages.save(s, first, content="m0 edited")  # the trigger stamps a new revision
        await messages.add(s, tid, "assistant", content="a3")
    async with sessions() as s, s.begin():
        changed = await changes.changed(s, tid, max(rev for _, rev in await changes.changed(s, tid, 0)) - 2)
    assert {r.content for r, _ in changed} == {"m0 edited", "a3"}  # the two rows written last, no others
    assert await _read(sessions, held, tid) == ["m0 edited", "m1", "m2", "a3"]
    assert await _read(sessions, held, tid) == ["m0 edited", "m1", "m2", "a3"]  # nothing new: nothing changes


async def test_a_deletion_makes_it_read_everything_again(sessions: async_sessionmaker[AsyncSession]) -> None:
    tid = await _thread(sessions, 3)
    held = History()
    assert await _read(sessions, held, tid) == ["m0", "m1", "m2"]
    async with sessions() as s, s.begin():
        [middle] = [r for r in await messages.history(s, tid) if r.content == "m1"]
        assert await messages.remove(s, tid, middle.id) == [middle.id]
    assert await _read(sessions, held, tid) == ["m0", "m2"]


async def test_rows_keep_position_order_and_since_gives_a_turn(sessions: async_sessionmaker[AsyncSession]) -> None:
    tid = await _thread(sessions, 2)
    held = History()
    assert await _read(sessions, held, tid) == ["m0", "m1"]
    async with sessions() as s, s.begin():
        low = await messages.add(s, tid, "user", content="early", position=-5)  # not after the last one
        late = await messages.add(s, tid, "user", content="late")
    assert await _read(sessions, held, tid) == ["early", "m0", "m1", "late"]
    assert [r.content for r in held.since(late.position)] == ["late"]
    assert [r.content for r in held.since(low.position + 1)] == ["m0", "m1", "late"]


async def test_a_write_under_another_revision_sequence_value_is_never_missed(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Revisions come from one sequence shared by every thread: values other threads take leave gaps, never
    reorderings, for the rows of one thread (written under its row lock)."""
    tid, other = await _thread(sessions, 1), await _thread(sessions, 1)
    held = History()
    assert await _read(sessions, held, tid) == ["m0"]
    async with sessions() as s, s.begin():
        await messages.add(s, other, "user", content="elsewhere")
        await s.execute(text("SELECT nextval('message_revs')"))
        await messages.add(s, tid, "user", content="m1")
    assert await _read(sessions, held, tid) == ["m0", "m1"]


def _held(histories: Histories, thread_id: uuid.UUID, n: int) -> History:
    """The thread's kept history with `n` (unsaved) messages in it."""
    held = histories.of(thread_id)
    for i in range(len(held), n):
        held._put(tables.Message(id=uuid.uuid4(), position=i, role="user", status="completed", attachments=[]))
    return held


def test_a_worker_keeps_histories_within_a_budget_of_messages_least_recently_used_first() -> None:
    histories = Histories(budget=10)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    kept_a = _held(histories, a, 4)
    histories.trim(a)
    _held(histories, b, 4)
    histories.trim(b)
    assert histories.of(a) is kept_a  # within the budget: kept, and now the most recently used
    _held(histories, c, 5)
    histories.trim(c)  # 13 > 10: b, the least recently used, goes
    assert len(histories.of(a)) == 4 and len(histories.of(b)) == 0
    histories.drop(a)
    assert len(histories.of(a)) == 0
    huge = _held(histories, b, 50)
    histories.trim(b)  # alone over the budget: the most recent one is kept
    assert histories.of(b) is huge


async def test_the_history_and_the_inbox_are_read_in_one_statement_that_carries_the_deferred_writes(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`rows_and_waiting`: a step's first read after the fence. The writes deferred so far (a new message, an update of
    an old one, a log row) ride in it; the statement cannot see its own writes in the table, so the messages come
    back from the writes themselves: the new one with its position and revision, the updated one once, as written."""
    tid = await _thread(sessions, 2)
    held = History()
    assert await _read(sessions, held, tid) == ["m0", "m1"]
    async with sessions() as s, s.begin():
        thread = await s.get_one(tables.Thread, tid, with_for_update={"key_share": True})
        await queue.enqueue(s, tid, "message", {"content": "waiting"})  # input in the inbox
        [first, _] = await messages.history(s, tid)
        events.hold(s, tid)  # as the engine's transactions do: the messages' events wait for the last statement
        await messages.save(s, first, later=True, content="m0 edited")
        await messages.add(s, tid, "assistant", later=True, content="a2")
        sent: list[str] = []
        driver = await statements.driver(s, flush=False, carries=True)
        driver._conn.add_query_logger(lambda record: sent.append(record.query))
        assert await held.rows_and_waiting(s, thread) == (True, False)
        await asyncio.sleep(0)  # query loggers are called soon after
        assert len(sent) == 1 and "INSERT INTO messages" in sent[0] and "FROM inbox" in sent[0]
        assert [r.content for r in held.current()] == ["m0 edited", "m1", "a2"]
        assert held.current()[-1].position > held.current()[1].position
        await events.flush(s, thread)
    async with sessions() as s:  # written as read, and nothing more to read
        assert [r.content for r in await messages.history(s, tid)] == ["m0 edited", "m1", "a2"]
    assert await _read(sessions, held, tid) == ["m0 edited", "m1", "a2"]


async def test_the_first_look_takes_the_input_and_a_message_at_its_place_joins_without_being_read(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`take`: the history and the input in one statement; the message the input becomes is `add`ed at the place the
    look gave it. If its transaction does not commit the history is dropped (`Histories.settle`); if it does, the
    message stays, and the next read returns it again as written (with the revision it has now)."""
    tid = await _thread(sessions, 1)
    histories = Histories()
    async with sessions() as s, s.begin():
        await queue.enqueue(s, tid, "message", {"content": "posted"})
    for commit in (False, True):
        held = histories.of(tid)
        async with sessions() as s, s.begin():
            thread = await s.get_one(tables.Thread, tid, with_for_update={"key_share": True})
            events.hold(s, tid)
            input_waits, effects_wait, [taken] = await held.take(s, thread)
            assert (input_waits, effects_wait) == (True, False) and taken.place is not None
            row = await messages.add(s, tid, "user", later=True, content="posted", position=taken.place)
            held.add(row)
            assert [r.content for r in held.current()] == ["m0", "posted"]
            await events.flush(s, thread)
            if not commit:
                await s.rollback()
        histories.settle(tid, committed=commit)
        assert (histories.of(tid) is held) == commit and held.unwritten != commit
    async with sessions() as s, s.begin():
        thread = await s.get_one(tables.Thread, tid, with_for_update={"key_share": True})
        assert [(r.content, r.position) for r in await held.rows(s, thread)] == [
            ("m0", held.current()[0].position),
            ("posted", taken.place),
        ]
        assert len(held) == 2
