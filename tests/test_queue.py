"""The durable queue on real Postgres: enqueue, the inbox's reads, heartbeat, release (claims: test_claims.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app import claims, db, events, heartbeat, inputs, keys, queue, statements, tables, threads
from app.heartbeat import Heartbeat
from app.spec import define_agent
from tests.test_claims import claim_one, runnable

AGENT = define_agent(name="a", side_a={"prompt": "p"})


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    e = db.create_engine(database_url, 20)
    yield e
    await e.dispose()


@pytest.fixture
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return db.sessionmaker(engine)


async def _all_heard(sessions: async_sessionmaker[AsyncSession], channel: str, heard: list[str]) -> None:
    """Return once `heard` (a listener's payloads on `channel`) holds every notification committed so far: Postgres
    delivers them in commit order, so a marker notified now comes after them all (it is taken out again)."""
    marker = f"marker:{uuid.uuid4()}"
    async with sessions() as s, s.begin():
        await s.execute(text("SELECT pg_notify(:channel, :marker)"), {"channel": channel, "marker": marker})
    deadline = time.monotonic() + 10
    while marker not in heard:
        assert time.monotonic() < deadline, "the marker notification never came"
        await asyncio.sleep(0.005)
    heard.remove(marker)


async def test_input_enqueued_alongside_rides_with_the_held_events(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """`POST /messages`: the inbox row, the runnable mark and the wake-up go in the events' statement, with an event
    to write or without one; with no events held, `enqueue` does it all at once."""
    async with sessions() as s, s.begin():
        ids = [(await threads.create(s, AGENT, keys.OPEN)).id for _ in range(3)]
    woken: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(queue.WAKEUP_CHANNEL, lambda *a: woken.append(a[-1]))
    try:
        for tid, status in zip(ids, (threads.Status.QUEUED, None, None), strict=True):
            async with sessions() as s, s.begin():
                thread = await threads.get(s, tid, keys.OPEN, lock=True)
                held = tid != ids[2]
                if held:
                    events.hold(s, tid)
                sent: list[str] = []
                conn = (await statements.driver(s, flush=False))._conn
                conn.add_query_logger(logger := lambda r, into=sent: into.append(r.query))
                await asyncio.sleep(0)
                sent.clear()  # the lock's, logged late
                await queue.enqueue_alongside(s, tid, inputs.Kind.MESSAGE, {"id": str(uuid.uuid4()), "role": "user"})
                if status is not None:
                    await threads.set_status(s, thread, status)
                await asyncio.sleep(0)  # query loggers are called soon after
                assert len(sent) == (0 if held else 1)  # held back, or written at once
                await events.flush(s, thread)
                await asyncio.sleep(0)
                assert len(sent) == 1
                conn.remove_query_logger(logger)
        await _all_heard(sessions, queue.WAKEUP_CHANNEL, woken)
        assert len(woken) == 3
        async with sessions() as s:
            for tid in ids:
                row = await s.get_one(tables.Thread, tid)
                assert row.runnable_since is not None
                inbox = await queue.pending(s, tid)
                assert [i.kind for i in inbox] == [inputs.Kind.MESSAGE]
            assert [r.type for r in await events.read(s, ids[0], 0)] == ["thread_status"]
        claimed = {c.thread_id for c in [await claim_one(sessions) for _ in ids] if c is not None}
        assert claimed == set(ids)
    finally:
        await listener.close()


async def test_release_clears_runnable_unless_input_waits(sessions: async_sessionmaker[AsyncSession]) -> None:
    [tid] = await runnable(sessions, 1)
    claim = await claim_one(sessions)
    assert claim is not None
    async with sessions() as s, s.begin():
        assert await queue.take_inbox(s, tid)
        assert await queue.release(s, claim) is False
    assert await claim_one(sessions) is None
    # input arriving during the run keeps the thread runnable after release
    claim2_ids = await runnable(sessions, 1)
    claim2 = await claim_one(sessions)
    assert claim2 is not None and claim2.thread_id == claim2_ids[0]
    async with sessions() as s, s.begin():
        await queue.enqueue(s, claim2.thread_id, inputs.Kind.MESSAGE, {"id": str(uuid.uuid4()), "role": "user"})
    async with sessions() as s, s.begin():
        assert await queue.release(s, claim2) is True
    again = await claim_one(sessions)
    assert again is not None and again.thread_id == claim2.thread_id


@pytest.mark.parametrize("keep_attempt", [False, True])
async def test_a_release_writes_the_rows_changes_in_its_own_statement(
    sessions: async_sessionmaker[AsyncSession], keep_attempt: bool
) -> None:
    [tid] = await runnable(sessions, 1)
    claim = await claim_one(sessions)
    assert claim is not None
    async with sessions() as s, s.begin():
        thread = await claims.fence(s, claim)
        await queue.take_inbox(s, tid)
        thread.status, thread.attempt, thread.session_result = "idle", 3, {"done": True}
        assert await queue.release(s, claim, fenced=True, keep_attempt=keep_attempt, row=thread) is False
        assert not s.dirty  # nothing left for the commit's flush
        assert (thread.attempt, thread.lease_token, thread.runnable_since) == (2 if keep_attempt else 0, None, None)
    async with sessions() as s:
        stored = await s.get_one(tables.Thread, tid)
        assert (stored.status, stored.session_result) == ("idle", {"done": True})
        assert (stored.attempt, stored.lease_token, stored.lease_owner) == (2 if keep_attempt else 0, None, None)


@pytest.mark.parametrize("input_waits", [False, True])
async def test_a_release_rides_with_the_held_events(
    sessions: async_sessionmaker[AsyncSession], database_url: str, input_waits: bool
) -> None:
    """The engine's closing transaction: the lease, the row's changes, the events and the deferred writes in one
    statement; the thread stays runnable (and a worker is woken) only if input waits."""
    [tid] = await runnable(sessions, 1)
    claim = await claim_one(sessions)
    assert claim is not None
    woken: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(queue.WAKEUP_CHANNEL, lambda *a: woken.append(a[-1]))
    try:
        async with sessions() as s, s.begin():
            thread = await claims.fence(s, claim)
            events.hold(s, tid)
            if not input_waits:
                await queue.take_inbox(s, tid)
            thread.status, thread.attempt, thread.session_turns = "idle", 1, 4
            await events.append(s, tid, "turn_ended", {"side": "a", "reason": "stop_on_response"})
            await statements.defer(s, "UPDATE threads SET name = $1 WHERE id = $2", ["closed", tid])
            sent: list[str] = []
            conn = (await statements.driver(s, flush=False))._conn
            await asyncio.sleep(0)
            conn.add_query_logger(logger := lambda r, into=sent: into.append(r.query))
            await queue.release_with_events(s, claim, thread)
            await events.flush(s, thread)
            await asyncio.sleep(0)
            conn.remove_query_logger(logger)
            assert len(sent) == 1 and not s.dirty
            assert (thread.attempt, thread.lease_token, thread.lease_owner) == (0, None, None)
            assert (thread.runnable_since is not None) is input_waits
        async with sessions() as s:
            stored = await s.get_one(tables.Thread, tid)
            assert (stored.status, stored.session_turns, stored.name, stored.event_seq) == ("idle", 4, "closed", 1)
            assert (stored.attempt, stored.lease_token, stored.lease_owner) == (0, None, None)
            assert (stored.runnable_since is not None) is input_waits
            assert await s.get(tables.Lease, tid) is None
            assert [e.type for e in await events.read(s, tid, 0)] == ["turn_ended"]
        await _all_heard(sessions, queue.WAKEUP_CHANNEL, woken)
        assert len(woken) == (1 if input_waits else 0)
        assert ((await claim_one(sessions)) is not None) is input_waits
    finally:
        await listener.close()


async def test_the_held_events_carry_one_rider_and_nothing_after_a_release(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A wake-up and a release never ride in the events' statement together: a release with a wake-up held goes on
    its own, and nothing may mark the thread runnable once its release rides there."""
    tid, other = uuid.uuid4(), uuid.uuid4()
    release = dataclasses.replace(queue.RELEASING, args=(uuid.uuid4(), queue.WAKEUP_CHANNEL))
    async with sessions() as s:
        assert not events.add_rider(s, tid, queue.MARKED)  # nothing held
        events.hold(s, tid)
        assert not events.add_rider(s, other, queue.MARKED)  # another thread's events are not held
        assert events.add_rider(s, tid, queue.MARKED) and events.add_rider(s, tid, queue.MARKED)
        assert not events.add_rider(s, tid, release)
        events.hold(s, tid)
        assert events.add_rider(s, tid, release) and events.add_rider(s, tid, release)
        with pytest.raises(ValueError, match="nothing may ride"):
            events.add_rider(s, tid, queue.MARKED)


async def test_a_release_without_events_goes_at_the_last_flush_or_at_once(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """Held but with no event to write, the release still rides in one statement and announces no event; with
    nothing held it is a release of its own, at once."""
    announced: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(events.CHANNEL, lambda *a: announced.append(a[-1]))
    try:
        for held in (True, False):
            [tid] = await runnable(sessions, 1)
            claim = await claim_one(sessions)
            assert claim is not None
            async with sessions() as s, s.begin():
                thread = await claims.fence(s, claim)
                if held:
                    events.hold(s, tid)
                await queue.take_inbox(s, tid)
                await queue.release_with_events(s, claim, thread)
                assert (thread.lease_token is None) is not held  # held: at the flush
                await events.flush(s, thread)
                assert (thread.lease_token, thread.runnable_since) == (None, None)
            async with sessions() as s:
                assert await s.get(tables.Lease, tid) is None
                stored = await s.get_one(tables.Thread, tid)
                assert (stored.lease_token, stored.runnable_since, stored.event_seq) == (None, None, 0)
        await _all_heard(sessions, events.CHANNEL, announced)
        assert announced == []
    finally:
        await listener.close()


async def test_a_posted_message_is_one_statement_or_nothing(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """`POST /messages`' usual case: the inbox row, the runnable mark, `queued` with its event (only for an idle
    thread) and the wake-up in one autocommit statement; not the caller's, terminated or stopped: nothing at all."""
    principal = keys.Principal(user_id="ann", admin=False)
    async with sessions() as s, s.begin():
        idle, busy, stopped, ended = [(await threads.create(s, AGENT, principal)).id for _ in range(4)]
        for tid, column in ((busy, "status = 'running'"), (stopped, "stopped"), (ended, "terminated_at = now()")):
            value = "" if "=" in column else " = true"
            await s.execute(text(f"UPDATE threads SET {column}{value} WHERE id = :id"), {"id": tid})
    woken: list[str] = []
    announced: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(queue.WAKEUP_CHANNEL, lambda *a: woken.append(a[-1]))
    await listener.add_listener(events.CHANNEL, lambda *a: announced.append(a[-1]))
    try:
        for tid, user, expected in (
            (idle, "ann", True),
            (busy, None, True),  # an admin
            (idle, "bob", False),  # not his
            (stopped, "ann", False),
            (ended, "ann", False),
            (uuid.uuid4(), None, False),
        ):
            async with db.autocommit(sessions) as s:
                driver = await statements.driver(s)
                sent: list[str] = []
                driver._conn.add_query_logger(logger := lambda r, into=sent: into.append(r.query))
                payload = {"id": str(uuid.uuid4()), "role": "user", "content": "hi"}
                assert await queue.post(driver, tid, user, payload) is expected
                await asyncio.sleep(0)
                driver._conn.remove_query_logger(logger)
                assert len(sent) == 1  # no BEGIN, no COMMIT
        await _all_heard(sessions, queue.WAKEUP_CHANNEL, woken)
        await _all_heard(sessions, events.CHANNEL, announced)
        assert len(woken) == 2  # idle (by ann, not by bob) and busy
        async with sessions() as s:
            rows = {t.id: t for t in (await s.execute(select(tables.Thread))).scalars()}
            assert (rows[idle].status, rows[busy].status) == ("queued", "running")
            assert rows[idle].runnable_since is not None and rows[busy].runnable_since is not None
            assert rows[stopped].runnable_since is None and rows[ended].runnable_since is None
            inbox = (await s.execute(select(tables.Inbox.thread_id))).scalars().all()
            assert sorted(map(str, inbox)) == sorted(map(str, [idle, busy]))
            queued = [(e.type, e.data) for e in await events.read(s, idle, 0)]
            assert queued == [("thread_status", {"status": "queued"})]
            assert await events.read(s, busy, 0) == []
        assert announced == [f'{idle}:1:[["thread_status",{{"status": "queued"}}]]']  # the event carried
    finally:
        await listener.close()


async def test_heartbeat_renews_held_leases_and_reports_lost_ones(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    await runnable(sessions, 2)
    kept = await claim_one(sessions, lease=0.2)
    stolen = await claim_one(sessions, lease=0.05)
    assert kept is not None and stolen is not None
    await asyncio.sleep(0.1)
    thief = await claim_one(sessions, "thief")
    assert thief is not None and thief.thread_id == stolen.thread_id
    conn = await db.connect(database_url)
    try:
        lost = await heartbeat.renew(conn, [kept, stolen], 30)
    finally:
        await conn.close()
    assert lost == {(stolen.thread_id, stolen.token)}
    async with sessions() as s:
        expires = (
            await s.execute(
                text("SELECT expires_at > now() + interval '20 seconds' FROM leases WHERE thread_id = :id"),
                {"id": kept.thread_id},
            )
        ).scalar_one()
    assert expires


async def test_heartbeat_renews_a_lease_whose_thread_row_a_transaction_holds(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """A thread row locked by a long transaction (a busy step, an enqueue) does not stop the renewal of its lease."""
    await runnable(sessions, 2)
    busy, free = await claim_one(sessions, lease=30), await claim_one(sessions, lease=30)
    assert busy is not None and free is not None
    conn = await db.connect(database_url)
    try:
        async with sessions() as s, s.begin():
            await claims.fence(s, busy)  # holds the row lock until this block ends
            lost = await asyncio.wait_for(heartbeat.renew(conn, [busy, free], 60), 2)
            assert lost == set()
            async with sessions() as r:
                renewed = await r.execute(
                    text("SELECT thread_id FROM leases WHERE expires_at > now() + interval '45 seconds'")
                )
                assert {row.thread_id for row in renewed} == {busy.thread_id, free.thread_id}
    finally:
        await conn.close()


async def test_a_transaction_stalled_past_the_lease_keeps_it_and_nobody_else_claims(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    """The chaos race, made deterministic: the worker's event loop blocks (a CPU-bound tool) inside a fenced
    transaction for twice the lease. The heartbeat, on its own OS thread, must keep the lease alive meanwhile, so that
    once the stalled transaction commits (and its execution starts a tool) no other worker can claim the thread."""
    await runnable(sessions, 1)
    lease = 0.45
    claim = await claim_one(sessions, lease=lease)
    assert claim is not None
    lost: list[set[tuple[uuid.UUID, uuid.UUID]]] = []
    beat = Heartbeat(database_url, False, lease, 60, lambda: [claim], lost.append)
    beat.start()
    try:
        async with sessions() as s, s.begin():
            await claims.fence(s, claim)
            time.sleep(lease * 2)  # noqa: ASYNC251 -- the loop blocked, the thread row locked, past the lease
            await beat.stop()  # what the lease is worth at the commit is what the heartbeat did during the stall
        assert await claim_one(sessions, "thief", lease=lease) is None  # still held: the tool may start
        async with sessions() as s, s.begin():
            assert (await claims.fence(s, claim)).id == claim.thread_id
    finally:
        await beat.stop()
    assert lost == []


async def test_enqueue_notifies_listeners_at_commit(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    got = asyncio.Event()
    conn = await db.connect(database_url)
    await conn.add_listener(queue.WAKEUP_CHANNEL, lambda *_: got.set())
    try:
        async with sessions() as s, s.begin():
            row = await threads.create(s, AGENT, keys.OPEN)
            await queue.enqueue(s, row.id, inputs.Kind.MESSAGE, {"id": str(uuid.uuid4()), "role": "user"})
            await asyncio.sleep(0.05)
            assert not got.is_set()  # nothing before commit
        await asyncio.wait_for(got.wait(), 5)
    finally:
        await conn.close()


async def test_a_release_racing_an_enqueue_keeps_the_threadrunnable(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """R8: an enqueue holding the thread row while the worker releases it; its input must not be stranded."""
    [tid] = await runnable(sessions, 1)
    claim = await claim_one(sessions)
    assert claim is not None
    async with sessions() as s, s.begin():
        await queue.take_inbox(s, tid)  # the run took its input

    async def release() -> bool:
        async with sessions() as s, s.begin():
            return await queue.release(s, claim)

    async with sessions() as poster, poster.begin():  # as `POST /messages` does: row lock, inbox row, runnable
        await poster.execute(text("SELECT 1 FROM threads WHERE id = :id FOR NO KEY UPDATE"), {"id": tid})
        await queue.enqueue(poster, tid, inputs.Kind.MESSAGE, {"id": str(uuid.uuid4()), "role": "user"})
        releasing = asyncio.create_task(release())
        await _waiting_for_a_lock(sessions)  # the release is now waiting for the row
        assert not releasing.done()
    assert await releasing is True
    async with sessions() as s:
        row = (
            await s.execute(text("SELECT runnable_since, lease_token FROM threads WHERE id = :id"), {"id": tid})
        ).one()
    assert row.runnable_since is not None and row.lease_token is None
    again = await claim_one(sessions)
    assert again is not None and again.thread_id == tid


async def _waiting_for_a_lock(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Return once a statement on this database waits for a lock."""
    waits = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    deadline = time.monotonic() + 10
    while True:
        async with sessions() as s:
            if (await s.execute(text(waits))).scalar_one():
                return
        assert time.monotonic() < deadline, "nothing came to wait for a lock"
        await asyncio.sleep(0.01)


async def test_the_janitor_check_repairs_a_stranded_thread_and_nothing_else(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    stranded, leased, stopped, waiting, idle = await runnable(sessions, 5)
    claim = await claim_one(sessions)  # the oldest: `stranded`, whose lease we drop by hand below
    assert claim is not None and claim.thread_id == stranded
    held = await claim_one(sessions)
    assert held is not None and held.thread_id == leased
    async with sessions() as s, s.begin():
        clear = "UPDATE threads SET runnable_since = NULL, lease_token = NULL WHERE id = :id"
        await s.execute(text(clear), {"id": stranded})  # what a lost wake-up leaves
        await s.execute(text("DELETE FROM leases WHERE thread_id = :id"), {"id": stranded})
        await s.execute(text("UPDATE threads SET runnable_since = NULL WHERE id = :id"), {"id": leased})
        await s.execute(
            text("UPDATE threads SET runnable_since = NULL, stopped = true WHERE id = :id"), {"id": stopped}
        )
        await s.execute(
            text("UPDATE threads SET runnable_since = NULL, status = 'waiting' WHERE id = :id"), {"id": waiting}
        )
        await queue.take_inbox(s, idle)
        await s.execute(text("UPDATE threads SET runnable_since = NULL WHERE id = :id"), {"id": idle})
    async with sessions() as s, s.begin():
        assert await queue.repair_stranded(s) == [stranded]
    async with sessions() as s, s.begin():
        assert await queue.repair_stranded(s) == []
    again = await claim_one(sessions)
    assert again is not None and again.thread_id == stranded


async def test_set_aside_input_is_neither_delivered_nor_a_reason_to_run(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    [tid] = await runnable(sessions, 1)
    claim = await claim_one(sessions)
    assert claim is not None
    async with sessions() as s, s.begin():
        [row] = await queue.pending(s, tid)
        await queue.set_aside(s, row.id, "bad input")
        assert await queue.take_inbox(s, tid) == []
        assert await queue.release(s, claim) is False
        assert await queue.repair_stranded(s) == []
        [kept] = await queue.pending(s, tid)
    assert (kept.id, kept.error) == (row.id, "bad input") and kept.set_aside_at is not None


async def test_the_inbox_look_carries_deferred_writes_unless_they_write_the_inbox(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`queue.waiting` (every step's opening) sends a tool call's deferred log row in its own statement; a deferred
    inbox row goes first, so the look sees it."""
    [tid] = await runnable(sessions, 1)
    for deferred_inbox in (False, True):
        log_id = uuid.uuid4()
        async with sessions() as s, s.begin():
            await queue.take_inbox(s, tid)
            conn = (await statements.driver(s, flush=False))._conn
            log = tables.Log(id=log_id, thread_id=tid, kind="tool", tool="t", status="success")
            await statements.defer(s, *statements.insert_statement(log))
            if deferred_inbox:
                inbox = "INSERT INTO inbox (thread_id, kind, payload) VALUES ($1, 'continue', '{}')"
                await statements.defer(s, inbox, [tid])
            sent: list[str] = []
            await asyncio.sleep(0)
            conn.add_query_logger(logger := lambda r, into=sent: into.append(r.query))
            found = await queue.waiting(s, tid)
            await asyncio.sleep(0)
            conn.remove_query_logger(logger)
            assert len(sent) == (2 if deferred_inbox else 1)
            assert found == (deferred_inbox, False)
            assert statements.deferred(s) == []
        async with sessions() as s:
            assert (await s.get_one(tables.Log, log_id)).kind == "tool"
