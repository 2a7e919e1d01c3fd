"""The worker's heartbeat: a long step keeps its lease, a lost lease cancels the execution before it writes."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import func, select, text

from app import catalog, claims, files, heartbeat, inputs, metrics, queue, tables
from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import define_agent, define_model, define_prompt
from app.worker import Worker
from tests.conftest import ROOT, client_for, wait_for
from tests.test_engine import settle, stored


def slow_catalog(seconds: float | list[float], record: dict[str, int]) -> Catalog:
    """A model that answers `done` after `seconds` (a list: per call, in order), counting calls and cancellations."""

    async def respond(request: LLMRequest) -> str:
        record["calls"] += 1
        try:
            await asyncio.sleep(seconds if isinstance(seconds, float | int) else seconds[record["calls"] - 1])
        except asyncio.CancelledError:
            record["cancelled"] += 1
            raise
        return "done"

    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", model="m", prompt="Be brief.", include_chat=True)
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={})


async def test_the_heartbeat_keeps_a_step_longer_than_the_lease(app_factory: Any) -> None:
    record = {"calls": 0, "cancelled": 0}
    cat = slow_catalog(1.5, record)  # three leases long
    first = await app_factory(cat, with_worker=True, lease_seconds=0.5)
    await app_factory(cat, with_worker=True, lease_seconds=0.5)  # a second worker, ready to steal an expired lease
    client = client_for(first)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    await client.post(f"/threads/{thread['id']}/messages", json={"content": "hi"})
    await settle(client, thread["id"])
    assert record == {"calls": 1, "cancelled": 0}
    assert [r["content"] for r in await stored(client, thread["id"])] == ["hi", "done"]


async def test_a_lost_lease_cancels_the_execution_and_writes_nothing(app_factory: Any) -> None:
    record = {"calls": 0, "cancelled": 0}
    app = await app_factory(slow_catalog(30, record), with_worker=True, lease_seconds=0.6)
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    tid = uuid.UUID(thread["id"])
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})

    async def calling() -> bool:
        return record["calls"] == 1

    await wait_for(calling)
    async with app.state.runtime.sessions() as session, session.begin():  # someone else now holds (and renews) it
        thief = {"t": uuid.uuid4(), "id": tid}
        await session.execute(text("UPDATE threads SET lease_token = :t WHERE id = :id"), thief)
        renewed = "UPDATE leases SET token = :t, expires_at = now() + interval '1 hour' WHERE thread_id = :id"
        await session.execute(text(renewed), thief)

    async def cancelled() -> bool:
        return record["cancelled"] == 1

    await wait_for(cancelled, timeout=3)
    await wait_for(lambda: asyncio.sleep(0, not _executing(tid)))  # whatever it would write on its way out, written
    rows = await stored(client, str(tid))
    assert [(r["role"], r["status"]) for r in rows] == [("user", "completed"), ("assistant", "pending")]
    async with app.state.runtime.sessions() as session:
        logs = (await session.execute(select(func.count()).where(tables.Log.thread_id == tid))).scalar_one()
    assert logs == 0


async def test_shutdown_hands_the_lease_back_without_spending_the_attempt(
    app_factory: Any, settings: Any, llm_client: Any
) -> None:
    from app.api.app import create_app

    record = {"calls": 0, "cancelled": 0}
    cat = slow_catalog([30, 0], record)  # the first call outlasts the shutdown; the one after the restart answers
    app = create_app(settings, cat, with_worker=True, http=llm_client)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    tid = uuid.UUID(thread["id"])
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})

    async def calling() -> bool:
        return record["calls"] == 1

    await wait_for(calling)
    await lifespan.__aexit__(None, None, None)  # SIGTERM path: stop claiming, cancel, release
    assert record["cancelled"] == 1
    async with app.state.runtime.sessions() as session:
        row = (await session.execute(select(tables.Thread).where(tables.Thread.id == tid))).scalar_one()
        assert (row.lease_token, row.attempt) == (None, 0)
        assert row.runnable_since is not None
    await app.state.runtime.db.dispose()  # the stopped app's pool, opened again by that read (see test_effects)

    restarted = await app_factory(cat, with_worker=True)
    other = client_for(restarted)
    await settle(other, str(tid))
    assert [(r["role"], r["content"]) for r in await stored(other, str(tid))] == [
        ("user", "hi"),
        ("assistant", "done"),
    ]
    assert record["calls"] == 2


async def test_three_crashed_attempts_at_one_step_fail_the_session(app_factory: Any, settings: Any) -> None:
    record = {"calls": 0, "cancelled": 0}
    cat = slow_catalog(0, record)
    api = await app_factory(cat)
    client = client_for(api)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    tid = uuid.UUID(thread["id"])
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
    # three claims of this step died with their worker
    async with api.state.runtime.sessions() as session, session.begin():
        await session.execute(text("UPDATE threads SET attempt = 3 WHERE id = :id"), {"id": tid})

    await app_factory(cat, with_worker=True)

    async def ended() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/threads/{tid}")).json()
        return body if body["status"] == "idle" else None

    body = await wait_for(ended)
    assert record["calls"] == 0
    assert body["session"]["status"] in (None, "failure")
    assert [(r["role"], r["content"]) for r in await stored(client, str(tid))] == [("user", "hi")]  # input kept
    events = [(e["type"], e["data"]) for e in await _events(api, tid)]
    assert any(t == "error" and d["code"] == "crashed" and "crashed 3 times" in d["message"] for t, d in events)


def _executing(tid: uuid.UUID) -> bool:
    """Whether an execution of the thread is still running in this process (the worker names its tasks so)."""
    return any(t.get_name() == f"thread-{tid}" and not t.done() for t in asyncio.all_tasks())


async def _events(app: Any, tid: uuid.UUID) -> list[dict[str, Any]]:
    async with app.state.runtime.sessions() as session:
        rows = (await session.execute(select(tables.Event).where(tables.Event.thread_id == tid))).scalars()
        return [{"type": r.type, "data": r.data} for r in rows]


async def test_the_janitor_collects_file_content_nothing_points_at(app_factory: Any) -> None:
    app = await app_factory(
        catalog.load(ROOT / "agents"), with_worker=True, cleanup_interval=0.05, blob_grace_seconds=0
    )
    client = client_for(app)
    tid = uuid.UUID((await client.post("/threads", json={"agent": "assistant"})).json()["id"])
    async with app.state.runtime.sessions() as session, session.begin():
        await files.write_bytes(session, tid, "/keep.txt", b"kept")
        await files.write_bytes(session, tid, "/drop.txt", b"dropped")
        await files.unlink(session, tid, "/drop.txt")

    async def blobs() -> list[int]:
        async with app.state.runtime.sessions() as session:
            return list((await session.execute(text("SELECT size FROM blobs ORDER BY size"))).scalars())

    await wait_for(lambda: _equals(blobs, [4]))


async def _equals(read: Any, expected: Any) -> bool:
    return bool(await read() == expected)


async def test_poison_input_is_set_aside_once_and_the_thread_takes_new_input(app_factory: Any) -> None:
    """An inbox row whose delivery raises is kept, marked and reported once; it never loops, and later input runs."""
    record = {"calls": 0, "cancelled": 0}
    app = await app_factory(slow_catalog(0, record), with_worker=True)
    client = client_for(app)
    tid = uuid.UUID((await client.post("/threads", json={"agent": "agent"})).json()["id"])
    # a message row without its id: delivery raises
    async with app.state.runtime.sessions() as session, session.begin():
        await queue.enqueue(session, tid, inputs.Kind.MESSAGE, {"role": "user", "content": "poison"})

    async def reported() -> list[dict[str, Any]]:
        return [e for e in await _events(app, tid) if e["type"] == "error"]

    [error] = await wait_for(reported)
    assert error["data"]["code"] == "input_set_aside" and "ValueError: id: Field required" in error["data"]["message"]
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
    await settle(client, str(tid))
    await asyncio.sleep(0.15)  # three poll intervals: long enough for a loop to show itself
    assert len(await reported()) == 1 and record["calls"] == 1
    listed = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    assert [(m["content"], m["status"]) for m in listed] == [
        ("hi", "completed"),
        ("done", "completed"),
        ("poison", "failed"),
    ]
    why = listed[2]["metadata"]["error"]
    assert listed[2]["metadata"]["set_aside"] is True and why["code"] == "input_set_aside"
    assert "id: Field required" in why["message"]
    async with app.state.runtime.sessions() as session:
        row = (await session.execute(select(tables.Thread).where(tables.Thread.id == tid))).scalar_one()
    assert (row.runnable_since, row.lease_token) == (None, None)


async def test_input_waiting_through_repeated_crashes_is_set_aside(app_factory: Any) -> None:
    """Past the crash budget, and crashing even while failing the session, the waiting input is what kills the
    worker: it is set aside instead of being delivered again."""
    record = {"calls": 0, "cancelled": 0}
    cat = slow_catalog(0, record)
    api = await app_factory(cat)
    client = client_for(api)
    tid = uuid.UUID((await client.post("/threads", json={"agent": "agent"})).json()["id"])
    await client.post(f"/threads/{tid}/messages", json={"content": "deadly"})
    async with api.state.runtime.sessions() as session, session.begin():
        await session.execute(text("UPDATE threads SET attempt = 4 WHERE id = :id"), {"id": tid})
    await app_factory(cat, with_worker=True)

    async def idle() -> bool:
        return bool((await client.get(f"/threads/{tid}")).json()["status"] == "idle")

    await wait_for(idle)
    assert record["calls"] == 0
    listed = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    assert [(m["content"], m["status"], m["metadata"].get("set_aside")) for m in listed] == [("deadly", "failed", True)]
    codes = [e["data"]["code"] for e in await _events(api, tid) if e["type"] == "error"]
    assert codes == ["input_set_aside", "crashed"]
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
    await settle(client, str(tid))
    assert record["calls"] == 1


def test_a_lost_lease_cancels_only_the_execution_that_held_it(settings: Any) -> None:
    """A thread released and claimed again while the heartbeat ran has a new token: its new execution goes on."""

    meter = metrics.Meter()

    async def scenario() -> tuple[bool, bool, bool]:
        worker = Worker(settings, None, SimpleNamespace(meter=meter))  # type: ignore[arg-type]
        tid = uuid.uuid4()
        old, new = uuid.uuid4(), uuid.uuid4()
        task = asyncio.create_task(asyncio.sleep(10))
        worker._running[tid] = (claims.Claim(tid, new, 1), task)
        worker._cancel_lost({(tid, old)})
        worker._abandon(f"{tid}:{old}")
        await asyncio.sleep(0)
        kept = not task.cancelled()
        worker._abandon(f"{tid}:{new}")
        await asyncio.sleep(0)
        abandoned = task.cancelled()
        again = asyncio.create_task(asyncio.sleep(10))
        worker._running[tid] = (claims.Claim(tid, new, 1), again)
        worker._cancel_lost({(tid, new)})
        await asyncio.sleep(0)
        return kept, abandoned, again.cancelled()

    assert asyncio.run(scenario()) == (True, True, True)
    assert (
        meter.work.get_sample_value("agents_lease_losses_total") == 1
    )  # the loss of the execution it cancelled, not the stale report


async def test_an_idle_worker_claims_once_per_notice_and_not_when_a_slot_frees(
    app_factory: Any, monkeypatch: Any
) -> None:
    """One claim statement takes what a notice made runnable; a claim that found less than it asked for leaves
    nothing behind, so neither the end of an execution nor the claim itself needs another (empty) claim."""
    asked: list[int] = []
    original = claims.claim_many

    async def counted(*args: Any) -> list[claims.Claim]:
        found = await original(*args)
        asked.append(len(found))
        return found

    monkeypatch.setattr(claims, "claim_many", counted)
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True, poll_interval=30)
    client = client_for(app)
    await wait_for(lambda: asyncio.sleep(0, bool(asked)))  # the start's claim (no poll during the test)
    asked.clear()
    for _ in range(3):
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        assert (await client.post(f"/threads/{tid}/messages", json={"content": "hello"})).status_code == 202
        await settle(client, tid)
    await asyncio.sleep(0.1)  # an execution's end claims at once, if at all
    assert asked == [1, 1, 1]  # one per message, none empty


async def test_a_queue_connection_left_mid_statement_is_opened_anew(app_factory: Any, monkeypatch: Any) -> None:
    """asyncpg's `InternalClientError` ("another operation is in progress": a connection a database restart left
    mid-statement) once ended the worker process; the worker opens new connections and goes on claiming."""
    import asyncpg

    real = claims.claim_many
    broke: list[bool] = []

    async def once_broken(*args: Any, **kwargs: Any) -> Any:
        if not broke:
            broke.append(True)
            raise asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")
        return await real(*args, **kwargs)

    monkeypatch.setattr(claims, "claim_many", once_broken)
    record = {"calls": 0, "cancelled": 0}
    app = await app_factory(slow_catalog(0, record), with_worker=True)
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    await client.post(f"/threads/{thread['id']}/messages", json={"content": "hi"})
    await settle(client, thread["id"])
    assert broke and [r["content"] for r in await stored(client, thread["id"])] == ["hi", "done"]


async def test_a_lease_its_execution_gave_back_is_not_reported_lost(
    app_factory: Any, settings: Any, monkeypatch: Any, caplog: Any
) -> None:
    """The heartbeat reads the claims, then the database: a turn that ended in between has released its lease, and
    the report of it "lost" could reach the worker before the execution got past its releasing statement — which was
    then cancelled (its "turn ended" line lost, a lease loss counted, no fault anywhere). Here the heartbeat beats
    right after every statement of an execution returns, before the execution goes on: as it did in a B4 run,
    where it happened 2–5 times."""
    import asyncpg

    from app import db, heartbeat, worker

    beats: list[heartbeat.Heartbeat] = []

    class Recorded(heartbeat.Heartbeat):
        def start(self) -> None:
            beats.append(self)
            super().start()

    monkeypatch.setattr(worker, "Heartbeat", Recorded)
    conn = await db.connect(settings.database_url)
    reported: list[set[tuple[uuid.UUID, uuid.UUID]]] = []
    beating: list[bool] = []  # the beat's own statement is not followed by another

    async def beat_now() -> None:
        task = asyncio.current_task()
        held = beats[0]._held() if beats else []
        if beating or not held or task is None or not task.get_name().startswith("thread-"):
            return
        beating.append(True)
        try:
            lost = await heartbeat.renew(conn, held, settings.lease_seconds)
        finally:
            beating.clear()
        if lost:
            reported.append(lost)
            beats[0]._on_lost(lost)

    for name in ("execute", "fetch", "fetchrow", "fetchval"):  # every statement, a session's COMMIT included
        real = getattr(asyncpg.connection.Connection, name)

        def after(real: Any = real) -> Any:
            async def statement(self: Any, *args: Any, **kwargs: Any) -> Any:
                result = await real(self, *args, **kwargs)
                await beat_now()  # the database has done it; the execution has not gone on yet
                return result

            return statement

        monkeypatch.setattr(asyncpg.connection.Connection, name, after())
    try:
        record = {"calls": 0, "cancelled": 0}
        app = await app_factory(slow_catalog(0, record), with_worker=True)
        client = client_for(app)
        tid = uuid.UUID((await client.post("/threads", json={"agent": "agent"})).json()["id"])
        caplog.set_level("INFO", logger="app")
        await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
        await settle(client, str(tid))
        await wait_for(lambda: asyncio.sleep(0, not _executing(tid)))
    finally:
        await conn.close()
    assert reported and all(tid in {t for t, _ in lost} for lost in reported)  # the heartbeat did see it gone
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "lease of thread" in line]
    assert [line for line in said if line.startswith(f"turn ended: thread={tid}")]
    assert app.state.runtime.meter.work.get_sample_value("agents_lease_losses_total") == 0


async def test_executions_waiting_on_a_model_hold_no_connection(app_factory: Any) -> None:
    """What lets a worker run 1,000 turns at once (`WORKER_CONCURRENCY`) on a pool of `DB_POOL_SIZE`: an execution
    waiting on its model holds no connection. Eight wait at once on a pool of one, and none holds one meanwhile."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    count = 8
    holding: dict[int, str] = {}  # connection record → the execution task that checked it out

    def out(_: Any, record: Any, __: Any) -> None:
        task = asyncio.current_task()
        if task is not None and task.get_name().startswith("thread-"):
            holding[id(record)] = task.get_name()

    def back(_: Any, record: Any) -> None:
        holding.pop(id(record), None)

    everyone = asyncio.Event()
    answer = asyncio.Event()
    calls = 0

    async def respond(request: LLMRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == count:
            everyone.set()
        await answer.wait()
        return "done"

    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", model="m", prompt="Be brief.", include_chat=True)
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    cat = Catalog(root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={})
    event.listen(Pool, "checkout", out)
    event.listen(Pool, "checkin", back)
    try:
        app = await app_factory(cat, with_worker=True, worker_concurrency=count, db_pool_size=1)
        client = client_for(app)
        tids = [(await client.post("/threads", json={"agent": "agent"})).json()["id"] for _ in range(count)]
        for tid in tids:
            await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
        await asyncio.wait_for(everyone.wait(), 10)  # with a connection held per wait, the second would never come
        await asyncio.sleep(0.05)
        held_while_waiting = dict(holding)
        answer.set()
        for tid in tids:
            await settle(client, tid)
    finally:
        event.remove(Pool, "checkout", out)
        event.remove(Pool, "checkin", back)
    assert held_while_waiting == {}
    for tid in tids:
        assert [r["content"] for r in await stored(client, tid)] == ["hi", "done"]


async def test_executions_at_work_are_bounded_apart_from_those_waiting_on_a_model(app_factory: Any) -> None:
    """`WORKER_CONCURRENCY` executions may wait on their model at once; of them only `WORKER_ACTIVE` do anything
    else at once (here: run a tool), the others waiting for a turn."""
    from app.spec import ThreadState, define_tool

    count, active = 6, 2
    everyone = asyncio.Event()
    calls = 0
    running = most = 0

    async def respond(request: LLMRequest) -> Any:
        nonlocal calls
        if request.messages[-1].role == "tool":
            return "done"
        calls += 1
        if calls == count:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 10)  # all of them wait on the model at once
        return {"tool_calls": [{"name": "work", "arguments": {}}]}

    @define_tool(description="Works a while.")
    async def work(state: ThreadState) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1
        return "worked"

    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", model="m", prompt="Work.", include_chat=True, tools=["work"])
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    cat = Catalog(
        root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={"work": work}
    )
    app = await app_factory(cat, with_worker=True, worker_concurrency=count, worker_active=active)
    client = client_for(app)
    tids = [(await client.post("/threads", json={"agent": "agent"})).json()["id"] for _ in range(count)]
    for tid in tids:
        await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    for tid in tids:
        await settle(client, tid)
        assert [r["content"] for r in await stored(client, tid)][-1] == "done"
    assert everyone.is_set()
    assert most == active
