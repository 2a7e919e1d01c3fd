"""The event log: batched appends, retention (`events_missed`) and the lifecycle stream `GET /events` over real HTTP."""

from __future__ import annotations

import asyncio
import json
import typing
import uuid
from typing import Any, cast

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import catalog, db, event_types, events, keys, messages, statements, tables, threads
from app.spec import define_agent
from tests.conftest import ROOT, client_for, wait_for
from tests.test_api import read_events, turn

WEEK = 7 * 86_400


async def _key(app: Any, user: str, admin: bool = False) -> str:
    async with app.state.runtime.sessions() as s, s.begin():
        _, key = await keys.create(s, user, admin)
    return key


def test_append_takes_each_stored_type_with_its_payload_in_the_table() -> None:
    taken: dict[str, Any] = {}
    for variant in typing.get_overloads(events.append):
        hints = typing.get_type_hints(variant)
        taken |= dict.fromkeys(typing.get_args(hints["type_"]), hints["data"])
    assert taken == event_types.STORED


async def test_events_missed_after_retention(app_factory: Any, serve: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    await turn(client, tid, "what is 2 + 2?")
    async with app.state.runtime.sessions() as session, session.begin():
        await session.execute(
            text("UPDATE events SET created_at = now() - interval '8 days' WHERE thread_id = :id AND seq <= 3"),
            {"id": uuid.UUID(tid)},
        )
        assert await events.expire(session, WEEK) >= 3
        last = (
            await session.execute(text("SELECT event_seq FROM threads WHERE id = :id"), {"id": uuid.UUID(tid)})
        ).scalar_one()
    base = await serve(app)
    frames = await read_events(base, f"/threads/{tid}/events", "turn_ended")
    assert frames[0] == {"event": "events_missed", "data": {"oldest_seq": 4}}
    assert [int(f["id"]) for f in frames[1:]] == list(range(4, len(frames) + 3))
    # a resume point past the gap needs no warning
    resumed = await read_events(base, f"/threads/{tid}/events?since=5", "turn_ended")
    assert resumed[0]["id"] == "6" and all(f["event"] != "events_missed" for f in resumed)
    assert int(frames[-1]["id"]) <= last


async def test_every_event_expired_still_says_where_the_log_goes_on(app_factory: Any, serve: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "hello"})  # thread_status: queued (seq 1)
    async with app.state.runtime.sessions() as session, session.begin():
        await session.execute(text("UPDATE events SET created_at = now() - interval '8 days'"))
        await events.expire(session, WEEK)
    base = await serve(app)
    frames = await read_events(base, f"/threads/{tid}/events", "events_missed")
    assert frames == [{"event": "events_missed", "data": {"oldest_seq": 2}}]


async def test_a_resume_point_past_the_last_event_is_events_missed_and_the_log_again(
    app_factory: Any, serve: Any
) -> None:
    """A database restored from a backup older than what a client saw: its `Last-Event-ID` is past the thread's last
    event. Before, the stream waited for events after it and left out every one the restored server wrote up to it."""
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    await turn(client, tid, "what is 2 + 2?")
    async with app.state.runtime.sessions() as session:
        last = (
            await session.execute(text("SELECT event_seq FROM threads WHERE id = :id"), {"id": uuid.UUID(tid)})
        ).scalar_one()
    base = await serve(app)
    frames = await read_events(base, f"/threads/{tid}/events", "turn_ended", headers={"Last-Event-ID": str(last + 5)})
    assert frames[0] == {"event": "events_missed", "data": {"oldest_seq": 1}}
    assert [int(f["id"]) for f in frames[1:]] == list(range(1, len(frames)))  # the stored log, from its start
    # at the last event exactly, nothing was missed
    reader = asyncio.create_task(read_events(base, f"/threads/{tid}/events?since={last}", "turn_ended"))
    await turn(client, tid, "and 3 + 3?")
    after = await asyncio.wait_for(reader, 10)
    assert after[0]["id"] == str(last + 1) and all(f["event"] != "events_missed" for f in after)


async def test_lifecycle_stream_follows_the_callers_threads(app_factory: Any, serve: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    alice, bob, admin = await _key(app, "alice"), await _key(app, "bob"), await _key(app, "root", admin=True)
    base = await serve(app)
    headers = {"Authorization": f"Bearer {alice}"}
    reader = asyncio.create_task(read_events(base, "/events", "thread_deleted", headers=headers))
    await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 1), interval=0.01)  # it subscribed
    async with client_for(app, bob) as b:
        theirs = (await b.post("/threads", json={"agent": "assistant"})).json()["id"]
    async with client_for(app, alice) as a:
        mine = (await a.post("/threads", json={"agent": "assistant"})).json()["id"]
        patched = await a.patch(f"/threads/{mine}", json={"name": "renamed", "tags": ["x"]})
        assert patched.status_code == 200 and patched.json()["name"] == "renamed"
        assert (await a.delete(f"/threads/{mine}")).json() == {"deleted": [mine]}
        assert (await a.get(f"/threads/{mine}")).status_code == 404
    frames = await asyncio.wait_for(reader, 10)
    assert [(f["event"], f["data"]["thread_id"]) for f in frames] == [
        ("thread_created", mine),
        ("thread_updated", mine),
        ("thread_deleted", mine),
    ]
    assert frames[1]["data"]["name"] == "renamed"
    # the admin sees everyone's, and resumes with Last-Event-ID
    everything = await read_events(base, "/events", "thread_deleted", headers={"Authorization": f"Bearer {admin}"})
    assert [f["data"]["thread_id"] for f in everything] == [theirs, mine, mine, mine]
    after_first = await read_events(
        base,
        "/events",
        "thread_deleted",
        headers={"Authorization": f"Bearer {admin}", "Last-Event-ID": everything[0]["id"]},
    )
    assert [f["id"] for f in after_first] == [f["id"] for f in everything[1:]]


async def test_patch_and_delete_threads(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    client = client_for(app)
    tid = (
        await client.post("/threads", json={"agent": "assistant", "env": {"TOKEN": "s3"}, "secrets": ["TOKEN"]})
    ).json()["id"]
    changed = await client.patch(f"/threads/{tid}", json={"env": {"TOKEN": "s4", "MODE": "fast"}})
    assert changed.json()["env"] == {"TOKEN": None, "MODE": "fast"}  # a secret stays secret when updated
    assert changed.json()["env_types"] == {"TOKEN": "secret", "MODE": "text"}
    dropped = await client.patch(f"/threads/{tid}", json={"env_delete": ["MODE"]})
    assert dropped.json()["env"] == {"TOKEN": None}
    bad = await client.patch(f"/threads/{tid}", json={"secrets": ["NOPE"]})
    assert bad.status_code == 400 and "NOPE" in bad.json()["error"]["message"]
    assert (await client.patch(f"/threads/{tid}", json={"colour": "red"})).status_code == 422

    child = uuid.uuid4()
    async with app.state.runtime.sessions() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO threads (id, agent, type, user_id, parent_id, root_id) "
                "VALUES (:c, 'assistant', 'ai_human', :u, :p, :p)"
            ),
            {"c": child, "u": (await client.get(f"/threads/{tid}")).json()["user_id"], "p": uuid.UUID(tid)},
        )
    response = await client.delete(f"/threads/{tid}")
    assert response.json() == {"deleted": [str(child), tid]}  # children first
    assert (await client.get(f"/threads/{child}")).status_code == 404
    async with app.state.runtime.sessions() as session:
        left = (
            await session.execute(text("SELECT count(*) FROM env_values WHERE owner = :o"), {"o": tid})
        ).scalar_one()
    assert left == 0
    assert (await client.delete(f"/threads/{tid}")).status_code == 404


async def test_held_events_carry_the_thread_rows_changes_in_one_statement(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """An engine transaction's events and its thread row's changes are written by one statement at its end."""
    agent = define_agent(name="a", side_a={"prompt": "p"})
    async with sessions() as s, s.begin():
        tid = (await threads.create(s, agent, keys.OPEN)).id
    async with sessions() as s, s.begin():
        thread = await threads.get(s, tid, keys.OPEN, lock=True)
        events.hold(s, tid)
        await events.append(s, tid, "step_started", {"step": 1, "side": "a"})
        await events.append(s, tid, "llm_request", {"model": "m", "attempt": 1})
        thread.status, thread.session_result = "running", {"n": 1}
        sent: list[str] = []
        raw = await statements.driver(s, flush=False)
        raw._conn.add_query_logger(lambda record: sent.append(record.query))
        await events.flush(s, thread)
        await asyncio.sleep(0)  # query loggers are called soon after
        assert len(sent) == 1 and not s.dirty  # written and settled: nothing left for the commit's flush
    async with sessions() as s:
        stored = await s.get_one(tables.Thread, tid)
        assert (stored.status, stored.session_result, stored.event_seq) == ("running", {"n": 1}, 2)
        assert [r.type for r in await events.read(s, tid, 0)] == ["step_started", "llm_request"]


@pytest.mark.parametrize("guarded", [False, True])
async def test_live_notifications_ride_in_the_events_statement_before_their_own(
    sessions: async_sessionmaker[AsyncSession], database_url: str, guarded: bool
) -> None:
    """`notify_first` (an answer's last deltas): sent by the statement that writes the held events, in a fenced
    transaction or alone guarded, and heard before the events' own notification, at the same commit."""
    agent = define_agent(name="a", side_a={"prompt": "p"})
    async with sessions() as s, s.begin():
        tid = (await threads.create(s, agent, keys.OPEN)).id
        record = await (await statements.driver(s)).fetchrow(
            "SELECT *, xmin::text AS row_xmin FROM threads WHERE id = $1", tid
        )
        assert record is not None
    heard: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(events.CHANNEL, lambda *args: heard.append(args[3]))
    live = [json.dumps([[str(tid), "message_chunk", {"chunk": chunk}]]) for chunk in "ab"]
    sent: list[str] = []
    try:
        async with sessions() as s:
            if guarded:  # the engine's answer: one statement outside any transaction, guarded by the row's version
                statements.writes_only(s)
                thread = statements.attach(s, tables.Thread, record)
            else:
                await s.begin()
                thread = await threads.get(s, tid, keys.OPEN, lock=True)
            events.hold(s, tid)
            await events.append(s, tid, "step_started", {"step": 1, "side": "a"})
            assert events.notify_first(s, tid, live) and not events.notify_first(s, uuid.uuid4(), live)
            thread.status = "running"
            async with db.autocommit(sessions) as auto:
                driver = await statements.driver(auto if guarded else s, flush=False)
                driver._conn.add_query_logger(lambda r: sent.append(r.query))
                guard = events.Guard(driver, "xmin = $1", (int(record["row_xmin"]),)) if guarded else None
                await events.flush(s, thread, guard=guard)
            if not guarded:
                await s.commit()

        async def all_heard() -> bool:
            return len(heard) == 3

        await wait_for(all_heard)
    finally:
        await listener.close()
    assert heard[:2] == live and heard[2].startswith(f"{tid}:1:")  # the deltas, then the event they precede
    assert len([q for q in sent if "pg_notify" in q]) == 1  # one statement carried both
    async with sessions() as s:
        assert (await s.get_one(tables.Thread, tid)).status == "running"


async def test_deferred_writes_ride_with_the_held_events_or_go_before_any_other_statement(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`statements.defer` writes (a request's log row, an answer) travel in the events' statement, their parameters
    numbered after the thread row's changes; any other statement (plain or SQLAlchemy's), a flush or the commit sends
    them first on their own; a savepoint writes them at once; a rollback drops them."""
    agent = define_agent(name="a", side_a={"prompt": "p"})
    async with sessions() as s, s.begin():
        tid = (await threads.create(s, agent, keys.OPEN)).id

    def log(n: int) -> tables.Log:
        return tables.Log(
            id=uuid.uuid4(),
            thread_id=tid,
            kind="llm",
            model=f"m{n}",
            provider="test",
            status="success",
            request={"n": n},
        )

    async def models(s: AsyncSession) -> list[str]:
        found = await s.execute(text("SELECT model FROM logs WHERE thread_id = :t ORDER BY model"), {"t": tid})
        return list(found.scalars())

    async with sessions() as s, s.begin():
        thread = await threads.get(s, tid, keys.OPEN, lock=True)
        events.hold(s, tid)
        sent: list[str] = []
        raw = await statements.driver(s, flush=False)
        raw._conn.add_query_logger(lambda record: sent.append(record.query))
        await statements.defer(s, *statements.insert_statement(log(1)))
        await statements.defer(s, *statements.insert_statement(log(2)))
        await asyncio.sleep(0)
        assert sent == []  # deferred
        assert await models(s) == ["m1", "m2"]  # a query sends them first
        await asyncio.sleep(0)
        assert sent[0].startswith("WITH w0 AS (INSERT INTO logs")  # both, in one statement
        await statements.defer(s, *statements.insert_statement(log(3)))
        found = await (await statements.driver(s)).fetchval("SELECT count(*) FROM logs WHERE thread_id = $1", tid)
        assert found == 3  # so does a plain statement
        await statements.defer(s, *statements.insert_statement(log(4)))
        await events.append(s, tid, "llm_response", cast(event_types.LlmResponse, {"model": "m4"}))
        thread.status = "running"
        await asyncio.sleep(0)  # query loggers are called soon after
        sent.clear()
        await events.flush(s, thread)
        await asyncio.sleep(0)
        assert len(sent) == 1 and not s.dirty  # the events, the row's change and the log row: one statement
    async with sessions() as s, s.begin():
        assert await models(s) == ["m1", "m2", "m3", "m4"]
        assert (await s.get_one(tables.Thread, tid)).status == "running"
        assert [r.type for r in await events.read(s, tid, 0)] == ["llm_response"]
        await statements.defer(s, *statements.insert_statement(log(5)))  # nothing held: the commit sends it
    async with sessions() as s:
        async with s.begin():
            await statements.defer(s, *statements.insert_statement(log(6)))
            await s.rollback()  # dropped with the transaction: not sent in the next one
        async with s.begin():
            assert await models(s) == ["m1", "m2", "m3", "m4", "m5"]
        async with s.begin():
            async with s.begin_nested() as savepoint:
                await statements.defer(s, *statements.insert_statement(log(7)))  # inside a savepoint: written at once
                await savepoint.rollback()
            assert await models(s) == ["m1", "m2", "m3", "m4", "m5"]
        async with s.begin():
            await statements.defer(
                s, *statements.insert_statement(log(8))
            )  # before a hook's savepoint, which rolls back
            async with events.written_at_once(s), s.begin_nested() as savepoint:
                await statements.defer(s, *statements.insert_statement(log(9)))
                await savepoint.rollback()
            await statements.defer(s, *statements.insert_statement(log(10)))
        async with s.begin():
            assert await models(s) == ["m1", "m10", "m2", "m3", "m4", "m5", "m8"]  # the savepoint took only its own


async def test_a_row_deferred_twice_keeps_its_last_write(sessions: async_sessionmaker[AsyncSession]) -> None:
    """One statement changes a row once: a second deferred UPDATE of it sends the first before it; the thread row
    (which the events statement updates) is never deferred."""
    agent = define_agent(name="a", side_a={"prompt": "p"})
    async with sessions() as s, s.begin():
        thread = await threads.create(s, agent, keys.OPEN)
        row = await messages.add(s, thread.id, "assistant", status="pending")
    async with sessions() as s, s.begin():
        thread = await threads.get(s, thread.id, keys.OPEN, lock=True)
        events.hold(s, thread.id)
        row = await messages.get(s, thread.id, row.id)
        await messages.save(s, row, later=True, content="first", status="completed")
        await messages.save(s, row, later=True, content="second")
        await statements.defer(s, "UPDATE threads SET name = $1 WHERE id = $2", ["renamed", thread.id])
        thread.status = "running"
        await events.flush(s, thread)
    async with sessions() as s:
        stored = await messages.get(s, thread.id, row.id)
        assert (stored.content, stored.status) == ("second", "completed")
        renamed = await s.get_one(tables.Thread, thread.id)
        assert (renamed.name, renamed.status) == ("renamed", "running")
        announced = [e.data["data"]["content"] for e in await events.read(s, thread.id, 0)]
        assert announced == [None, "first", "second"]  # the pending message's insert, then both updates
