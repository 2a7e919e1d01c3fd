"""`app/publisher.py`: streaming messages' partial texts, stored with the deltas (`Publisher.store`), on real
Postgres. (The deltas themselves: `tests/test_hub.py`.)"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import claims, db, keys, messages, publisher, statements, tables, threads
from app.spec import define_agent

AGENT = define_agent(name="a", side_a={"prompt": "p"})


class Gated:
    """A publisher's connection whose sends wait until `gate` opens (asyncpg's own attributes are read-only)."""

    def __init__(self, conn: Any, gate: asyncio.Event) -> None:
        self._conn, self._gate = conn, gate

    def is_closed(self) -> bool:
        return bool(self._conn.is_closed())

    async def execute(self, *args: Any) -> Any:
        await self._gate.wait()
        return await self._conn.execute(*args)

    async def close(self) -> None:
        await self._conn.close()


async def _streaming(sessions: async_sessionmaker[AsyncSession]) -> tuple[claims.Claim, uuid.UUID]:
    """A thread claimed by an execution, with a `pending` message (its answer, streaming)."""
    async with sessions() as s, s.begin():
        thread = await threads.create(s, AGENT, keys.OPEN)
        await messages.enqueue(s, thread, "user", "hi")
        pending = await messages.add(s, thread.id, "assistant", status="pending")
    async with db.alone(sessions) as driver:
        claim = await claims.claim(driver, "test", 30)
    assert claim is not None and claim.thread_id == thread.id
    return claim, pending.id


async def _content(sessions: async_sessionmaker[AsyncSession], message_id: uuid.UUID) -> str | None:
    async with sessions() as s:
        return (await s.get_one(tables.Message, message_id)).content


async def test_a_text_is_stored_only_while_the_lease_holds_and_the_message_is_pending(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    claim, message_id = await _streaming(sessions)
    sender = publisher.Publisher(database_url)
    store = sender.storing(claim.thread_id, claim.token)
    try:
        store(message_id, "so far")
        await sender.sent()
        assert await _content(sessions, message_id) == "so far"
        store(message_id, "so far, and")
        store(message_id, "so far, and more")  # queued together: the last one is written
        await sender.sent()
        assert await _content(sessions, message_id) == "so far, and more"
        sender.storing(claim.thread_id, uuid.uuid4())(message_id, "another lease")
        await sender.sent()
        assert await _content(sessions, message_id) == "so far, and more"
        async with sessions() as s, s.begin():
            await messages.save(s, await s.get_one(tables.Message, message_id), status="completed", content="done")
        store(message_id, "after its end")
        await sender.sent()
        assert await _content(sessions, message_id) == "done"
        async with sessions() as s, s.begin():
            await s.execute(delete(tables.Lease).where(tables.Lease.thread_id == claim.thread_id))
            await messages.save(s, await s.get_one(tables.Message, message_id), status="pending")
        store(message_id, "lease gone")
        await sender.sent()
        assert await _content(sessions, message_id) == "done"
    finally:
        await sender.close()


async def test_a_message_another_transaction_holds_is_skipped_and_the_deltas_go_out(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The answer being stored (or a stop) holds the message's row: the text is not written and not waited for, so
    the batch's deltas (every thread's) are not held up behind that transaction."""
    claim, message_id = await _streaming(sessions)
    listener = await db.connect(database_url)
    heard: list[str] = []
    await listener.add_listener(publisher.CHANNEL, lambda *args: heard.append(args[3]))
    sender = publisher.Publisher(database_url)
    try:
        async with sessions() as s, s.begin():
            driver = await statements.driver(s)
            await driver.execute("SELECT 1 FROM messages WHERE id = $1 FOR UPDATE", message_id)
            sender.publish(claim.thread_id, "message_chunk", {"message_id": str(message_id), "chunk": "a", "offset": 0})
            sender.storing(claim.thread_id, claim.token)(message_id, "a")
            await asyncio.wait_for(sender.sent(), 5)  # not behind the lock
        assert await _content(sessions, message_id) is None
        for _ in range(100):
            if heard:
                break
            await asyncio.sleep(0.02)
        assert len(heard) == 1 and '"chunk": "a"' in heard[0]
    finally:
        await sender.close()
        await listener.close()


async def test_a_thread_s_texts_queued_are_dropped_when_its_deltas_are_taken(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """`take`: the statement that stores the answer sends the thread's last deltas and writes the whole text, so the
    partial texts still queued are not written after it; another thread's are."""
    claim, message_id = await _streaming(sessions)
    other, other_message = await _streaming(sessions)
    sender = publisher.Publisher(database_url)
    gate = asyncio.Event()
    try:
        sender.publish(uuid.uuid4(), "message_chunk", {"message_id": "warm", "chunk": "x", "offset": 0})
        await sender.sent()
        sender._conn = Gated(sender._conn, gate)  # type: ignore[assignment]
        sender.publish(uuid.uuid4(), "message_chunk", {"message_id": "held", "chunk": "x", "offset": 0})
        await asyncio.sleep(0)  # a batch under way, held at the gate: the rest stays queued
        sender.publish(claim.thread_id, "message_chunk", {"message_id": str(message_id), "chunk": "a", "offset": 0})
        sender.storing(claim.thread_id, claim.token)(message_id, "a")
        sender.storing(other.thread_id, other.token)(other_message, "b")
        assert len(await sender.take(claim.thread_id)) == 1  # the delta, packed; the text dropped
        gate.set()
        await asyncio.wait_for(sender.sent(), 5)
        assert await _content(sessions, message_id) is None
        assert await _content(sessions, other_message) == "b"
    finally:
        gate.set()
        await sender.close()
