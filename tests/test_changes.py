"""Changes (`app/changes.py`) on real Postgres: a thread's messages written since a revision, read with the inbox's
state and, at an execution's start, the input taken; the test owns each transaction."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import changes, claims, events, inputs, messages, queue, statements, threads
from tests.test_claims import claim_one, runnable
from tests.test_messages import new_thread


async def test_changed_returns_what_was_written_since_a_revision(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        first = await messages.add(s, thread.id, "user", content="one")
        second = await messages.add(s, thread.id, "user", content="two")
        third = await messages.add(s, thread.id, "user", content="three")
    async with sessions() as s:
        everything = await changes.changed(s, thread.id, 0)
    assert [r.id for r, _ in everything] == [first.id, second.id, third.id]
    revision = max(rev for _, rev in everything)
    async with sessions() as s, s.begin():
        await messages.save(s, await messages.get(s, thread.id, first.id), content="one, edited")
    async with sessions() as s:
        since = await changes.changed(s, thread.id, revision)
    assert [(r.id, r.content) for r, _ in since] == [(first.id, "one, edited")]
    assert since[0][1] > revision


async def test_changed_and_waiting_returns_each_message_once_with_the_writes_that_ride_in_it(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The deferred writes ride in the read: a message one of them updates comes back once, as written (not also as
    the table held it before), and one it inserts comes back with its position and revision."""
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        first = await messages.add(s, thread.id, "user", content="one")
        await messages.add(s, thread.id, "user", content="two")
    async with sessions() as s, s.begin():
        events.hold(s, thread.id)
        await messages.save(s, await messages.get(s, thread.id, first.id), later=True, content="one, edited")
        added = await messages.add(s, thread.id, "assistant", later=True, content="three")
        found, input_waits, effects_wait = await changes.changed_and_waiting(s, thread.id, 0)
        assert [r.content for r, _ in found] == ["one, edited", "two", "three"]
        assert (input_waits, effects_wait) == (False, False)
        assert added.position > found[1][0].position and found[2][1] > found[1][1]
        await events.flush(s, thread)


async def test_the_first_look_reads_the_history_and_takes_the_input_in_one_statement(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`changed_waiting_and_taking`: the messages changed since the revision given and the input taken come back from
    one statement, each message once (none of the taken rows mistaken for one); a message written at the place its
    input was given keeps it, before a message that takes its position as it is written, even riding in the same
    statement (Postgres runs it first)."""
    async with sessions() as s, s.begin():
        thread = await new_thread(s)
        await messages.add(s, thread.id, "user", content="one")
        await queue.enqueue(s, thread.id, inputs.Kind.MESSAGE, {"content": "two"})
        await queue.enqueue(s, thread.id, inputs.Kind.CONTINUE, {"side": "a"})
    async with sessions() as s, s.begin():
        events.hold(s, thread.id)
        found, input_waits, effects_wait, taken = await changes.changed_waiting_and_taking(s, thread.id, 0)
        assert [r.content for r, _ in found] == ["one"] and (input_waits, effects_wait) == (True, False)
        assert [r.kind for r in taken] == [inputs.Kind.MESSAGE, inputs.Kind.CONTINUE]
        assert taken[0].place is not None and taken[0].place > found[0][0].position
        sent: list[str] = []
        driver = await statements.driver(s, flush=False, carries=True)
        driver._conn.add_query_logger(lambda record: sent.append(record.query))
        placed = await messages.add(s, thread.id, "user", later=True, content="two", position=taken[0].place)
        await messages.add(s, thread.id, "assistant", later=True, content="three")
        await events.flush(s, thread)
        await asyncio.sleep(0)  # query loggers are called soon after
        assert len(sent) == 1  # both new messages in one statement
    async with sessions() as s:
        rows = await messages.history(s, thread.id)
        assert [r.content for r in rows] == ["one", "two", "three"] and rows[1].position == placed.position
        found, *_ = await changes.changed_waiting_and_taking(s, thread.id, max(rev for _, rev in found))
        assert [r.content for r, _ in found] == ["two", "three"]


async def test_the_first_look_takes_the_input_unless_an_effect_waits(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`changed_waiting_and_taking` (an execution's start): whether input and effects wait, and the input taken in
    the same statement; an effect waiting leaves the input where it is (due effects run first), and is never taken.
    Each message taken has a place in the history, in order; other input has none."""
    [tid] = await runnable(sessions, 1)  # one message waits
    async with sessions() as s, s.begin():
        await queue.enqueue(s, tid, inputs.Kind.EFFECT, {"effect_id": str(uuid.uuid4())})
        _, input_waits, effects_wait, taken = await changes.changed_waiting_and_taking(s, tid, 0)
        assert (input_waits, effects_wait, taken) == (True, True, [])
        [effect] = [r for r in await queue.pending(s, tid) if r.kind == inputs.Kind.EFFECT]
        await (await statements.driver(s)).execute("DELETE FROM inbox WHERE id = $1", effect.id)  # it ran
    async with sessions() as s, s.begin():
        await queue.enqueue(s, tid, inputs.Kind.CONTINUE, {"side": "a"})
        await queue.enqueue(s, tid, inputs.Kind.MESSAGE, {"content": "again"})
        _, input_waits, effects_wait, taken = await changes.changed_waiting_and_taking(s, tid, 0)
        assert (input_waits, effects_wait) == (True, False)
        assert [r.kind for r in taken] == [inputs.Kind.MESSAGE, inputs.Kind.CONTINUE, inputs.Kind.MESSAGE]  # in order
        first, _, again = taken
        assert first.place is not None and again.place is not None and first.place < again.place
        assert taken[1].place is None
        assert await queue.waiting(s, tid) == (False, False)  # taken


async def test_a_first_look_that_takes_the_lock_deletes_nothing_without_it(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """An execution's first look takes the row lock without waiting (`fence_later`); while the API holds the row
    (here: setting one input aside) it must not touch the inbox rows either: it would lock them before the row, the
    reverse of the API's order. It reads, takes nothing and says so (`Stale`) at once."""
    [tid] = await runnable(sessions, 1)
    async with sessions() as s, s.begin():
        await queue.enqueue(s, tid, inputs.Kind.CONTINUE, {"side": "a"})
    claim = await claim_one(sessions)
    assert claim is not None and claim.xmin is not None
    async with sessions() as api, api.begin():
        await threads.lock(api, tid)
        first, _ = await queue.pending(api, tid)
        await queue.set_aside(api, first.id, "held by the API")  # the API holds the row and that inbox row
        async with sessions() as s, s.begin():
            statements.fence_later(s, claims.fence_later(claim, claim.xmin))
            with pytest.raises(statements.Stale):
                await asyncio.wait_for(changes.changed_waiting_and_taking(s, tid, 0), 5)
        await api.rollback()
