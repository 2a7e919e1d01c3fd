"""Effects (`semantics.md` §10): scheduled, fired once by the timer into the thread's single flight, durable across
restarts, cancellable, listed over HTTP; a failing handler is recorded and never crashes the run."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import func, select, update

from app import db, effects, errors, keys, queue, tables
from app.api.app import create_app
from app.catalog import Catalog, check, load
from app.llm.base import LLMRequest
from app.settings import Settings
from app.spec import ThreadState, define_agent, define_effect, define_model, define_prompt, define_tool
from tests.conftest import ROOT, client_for, wait_for
from tests.test_engine import settle, stored
from tests.test_state import outside

handled: list[dict[str, Any]] = []  # what the effects saw, and the LLM calls and tools around them, in order


class PingArgs(BaseModel):
    text: str


@define_effect(description="Queue a reminder message.")
async def ping(state: ThreadState, args: PingArgs) -> None:
    handled.append({"effect": "ping", "context": dict(state.context), "execution": state.execution})
    await state.queue_message("user", f"Reminder: {args.text}")


@define_effect(description="Record what the handler sees, and queue nothing.")
async def probe(state: ThreadState) -> None:
    handled.append({"effect": "probe", "context": dict(state.context), "execution": state.execution})


@define_effect(description="Always raises.")
async def boom(state: ThreadState) -> None:
    handled.append({"effect": "boom", "context": dict(state.context), "execution": state.execution})
    try:
        token = " " + await state.env("TOKEN")
    except LookupError:
        token = ""
    raise RuntimeError(f"kaboom{token}")


class LaterArgs(BaseModel):
    text: str
    delay_ms: int


@define_tool(description="Schedule a reminder.")
async def later(state: ThreadState, args: LaterArgs) -> str:
    return await state.schedule_effect("ping", {"text": args.text}, args.delay_ms)


@define_tool(description="Schedule `probe` now, then work until the timer has queued it.")
async def busy(state: ThreadState) -> str:
    await state.schedule_effect("probe")
    for _ in range(200):  # the timer polls every 0.05 s
        if [e.status for e in await state.get_scheduled_effects("probe")] == ["queued"]:
            break
        await asyncio.sleep(0.05)
    handled.append({"tool": "busy"})
    return "worked"


def respond(request: LLMRequest) -> dict[str, Any]:
    """Schedule on `remind <text> in <ms>`; answer a reminder by echoing it."""
    last = request.messages[-1]
    content = str(last.content or "")
    handled.append({"llm": content})
    if last.role == "tool":
        return {"text": "scheduled"}
    if content == "work":
        return {"tool_calls": [{"name": "busy", "arguments": {}}]}
    if content.startswith("remind "):
        text, _, delay = content.removeprefix("remind ").rpartition(" in ")
        return {"tool_calls": [{"name": "later", "arguments": {"text": text, "delay_ms": int(delay)}}]}
    return {"text": f"noted: {content}"}


def catalog() -> Catalog:
    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", model="m", prompt="Be brief.", include_chat=True, tools=["later", "busy"])
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."),
        models={"m": model},
        prompts={"p": prompt},
        agents={"agent": agent},
        tools={"later": later, "busy": busy},
        effects={e.name: e for e in (ping, probe, boom)},
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    handled.clear()


async def started(app_factory: Any, **overrides: Any) -> tuple[FastAPI, Any, str]:
    app = await app_factory(catalog(), with_worker=True, **overrides)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    return app, client, tid


async def listed(client: Any, tid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/threads/{tid}/effects")
    assert response.status_code == 200
    return list(response.json()["effects"])


LATER_MS = 60_000  # an effect's delay that no test waits out: `due` makes it due


async def due(app: FastAPI, tid: str) -> None:
    """Bring the thread's effects forward by `LATER_MS`, as if that time had passed (their order stays)."""
    async with app.state.runtime.sessions() as session, session.begin():
        await session.execute(
            update(tables.Effect)
            .where(tables.Effect.thread_id == uuid.UUID(tid))
            .values(run_at=tables.Effect.run_at - timedelta(milliseconds=LATER_MS))
        )


async def final(client: Any, tid: str, effect_id: str) -> dict[str, Any]:
    async def finished() -> dict[str, Any] | None:
        row = next(e for e in await listed(client, tid) if e["id"] == effect_id)
        return row if row["status"] in ("done", "failed", "cancelled") else None

    result: dict[str, Any] = await wait_for(finished)
    return result


async def test_an_effect_fires_once_and_wakes_the_thread(app_factory: Any) -> None:
    app, client, tid = await started(app_factory)
    await client.post(f"/threads/{tid}/messages", json={"content": f"remind stretch in {LATER_MS}"})
    await settle(client, tid)
    [effect] = await listed(client, tid)
    assert (effect["name"], effect["args"], effect["status"], effect["attempts"]) == (
        "ping",
        {"text": "stretch"},
        "scheduled",
        0,
    )
    await due(app, tid)  # it falls due while the thread is idle
    done = await final(client, tid, effect["id"])
    assert (done["status"], done["attempts"], done["last_error"]) == ("done", 1, None)

    async def answered() -> list[dict[str, Any]] | None:
        rows = await stored(client, tid)
        return rows if rows[-1]["content"] == "noted: Reminder: stretch" else None

    rows = await wait_for(answered)
    assert [(r["role"], r["content"]) for r in rows if r["role"] != "tool"][-2:] == [
        ("user", "Reminder: stretch"),
        ("assistant", "noted: Reminder: stretch"),
    ]
    reminder = next(r for r in rows if r["content"] == "Reminder: stretch")
    assert reminder["metadata"] == {"source": "effect", "effect": "ping"}  # the effect's, not the user's
    # nothing fires twice: an effect due later has been queued by the timer and run by the thread since
    marker = await (await outside(app, tid)).schedule_effect("probe")
    assert (await final(client, tid, marker))["status"] == "done"
    ran = [r for r in handled if "effect" in r]
    assert [r["effect"] for r in ran] == ["ping", "probe"]
    assert ran[0]["execution"] is None
    assert ran[0]["context"] == {"effect": {"id": effect["id"], "name": "ping", "attempt": 1}}
    assert len(await stored(client, tid)) == len(rows)


async def test_an_effect_on_an_idle_thread_starts_no_turn_by_itself(app_factory: Any) -> None:
    app, client, tid = await started(app_factory)
    state = await outside(app, tid)
    effect_id = await state.schedule_effect("probe", delay_ms=0)
    done = await final(client, tid, effect_id)
    assert done["status"] == "done"
    seen = {"effect": "probe", "context": {"effect": {"id": effect_id, "name": "probe", "attempt": 1}}}
    assert handled == [{**seen, "execution": None}]
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["status"], thread["session"]["number"]) == ("idle", 0)
    assert await stored(client, tid) == []
    async with app.state.runtime.sessions() as session:  # the inbox row went with the handler's end
        count = select(func.count()).where(tables.Inbox.thread_id == uuid.UUID(tid))
        assert (await session.execute(count)).scalar_one() == 0


async def test_an_effect_due_mid_turn_runs_before_the_next_llm_call(app_factory: Any) -> None:
    _, client, tid = await started(app_factory)
    await client.post(f"/threads/{tid}/messages", json={"content": "work"})
    await settle(client, tid)
    assert [next(iter(r.values())) for r in handled] == ["work", "busy", "probe", "worked"]  # first keys
    assert [e["status"] for e in await listed(client, tid)] == ["done"]


async def test_each_due_effect_is_queued_by_exactly_one_timer(app_factory: Any) -> None:
    app = await app_factory(catalog())  # no worker: the timers are the four sessions below
    client = client_for(app)
    tids = [uuid.UUID((await client.post("/threads", json={"agent": "agent"})).json()["id"]) for _ in range(5)]
    async with app.state.runtime.sessions() as session, session.begin():
        for i in range(40):
            await effects.schedule(session, tids[i % 5], "probe", {}, 0)

    async def timer() -> int:
        total = 0
        while True:
            async with app.state.runtime.sessions() as session, session.begin():  # as the worker's timer sends it
                count = await effects.claim_due(session, 3)
            total += count
            if count == 0:
                return total

    # a timer stops at its first claim that finds nothing: all it saw due may have been locked by the others' claims
    # (a claim that skips an effect's thread still holds the effect's lock until it commits), as a real timer would
    # then wait for its next tick; so the four go again until every effect is claimed
    claimed = 0
    for _ in range(20):
        claimed += sum(await asyncio.gather(*(timer() for _ in range(4))))
        if claimed >= 40:
            break
    assert claimed == 40
    async with app.state.runtime.sessions() as session:
        rows = list((await session.execute(select(tables.Inbox).where(tables.Inbox.kind == "effect"))).scalars())
        threads = list((await session.execute(select(tables.Thread))).scalars())
    assert len({r.payload["effect_id"] for r in rows}) == len(rows) == 40
    assert all(t.runnable_since is not None for t in threads)


async def test_a_poll_that_queues_effects_wakes_the_workers_in_its_one_statement(
    app_factory: Any, database_url: str
) -> None:
    app = await app_factory(catalog())
    client = client_for(app)
    tid = uuid.UUID((await client.post("/threads", json={"agent": "agent"})).json()["id"])
    async with app.state.runtime.sessions() as session, session.begin():
        await effects.schedule(session, tid, "probe", {}, 0)
    heard: list[str] = []
    listener = await db.connect(database_url)
    await listener.add_listener(queue.WAKEUP_CHANNEL, lambda *args: heard.append(args[3]))
    try:
        for expected in (1, 0):  # each poll its own statement (autocommit here), the wake-up in it
            async with db.autocommit(app.state.runtime.sessions) as session:
                assert await effects.claim_due(session, 3) == expected
        await listener.execute(f"NOTIFY {queue.WAKEUP_CHANNEL}, 'marker'")

        async def marked() -> bool:
            return "marker" in heard

        await wait_for(marked)
    finally:
        await listener.close()
    assert heard == ["", "marker"]  # woken once: by the poll that queued one, not by the one that found none
    async with app.state.runtime.sessions() as session:
        [queued] = (await session.execute(select(tables.Effect))).scalars()
        assert queued.status == "queued"


async def test_a_scheduled_effect_survives_a_worker_restart(app_factory: Any, settings: Settings) -> None:
    first = create_app(settings, catalog(), with_worker=True)
    lifespan = first.router.lifespan_context(first)
    await lifespan.__aenter__()
    client = client_for(first)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    effect_id = await (await outside(first, tid)).schedule_effect("ping", {"text": "water"}, LATER_MS)
    await lifespan.__aexit__(None, None, None)  # the worker stops before the effect is due
    assert handled == []
    await due(first, tid)  # it falls due while no worker runs
    await first.state.runtime.db.dispose()  # `due` opened the closed app's pool again: left open, it is collected
    # later as an unclosed connection, and the warning fails whichever test runs then

    restarted = await app_factory(catalog(), with_worker=True)
    other = client_for(restarted)
    assert (await final(other, tid, effect_id))["status"] == "done"
    await settle(other, tid)
    assert [(r["role"], r["content"]) for r in await stored(other, tid)] == [
        ("user", "Reminder: water"),
        ("assistant", "noted: Reminder: water"),
    ]
    assert [r["effect"] for r in handled if "effect" in r] == ["ping"]


async def test_effects_can_be_cancelled_and_then_never_fire(app_factory: Any) -> None:
    app, client, tid = await started(app_factory)
    state = await outside(app, tid)
    by_http = await state.schedule_effect("ping", {"text": "a"}, LATER_MS)
    by_state = await state.schedule_effect("ping", {"text": "b"}, LATER_MS)
    kept = await state.schedule_effect("probe", None, LATER_MS)
    assert [e.id for e in await state.get_scheduled_effects()] == [by_http, by_state, kept]
    assert [e.id for e in await state.get_scheduled_effects("probe")] == [kept]

    cancelled = await client.post(f"/threads/{tid}/effects/{by_http}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = await client.post(f"/threads/{tid}/effects/{by_http}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert await state.remove_scheduled_effect(by_state) is True
    assert await state.remove_scheduled_effect(by_state) is False
    assert await state.remove_scheduled_effect(str(uuid.uuid4())) is False
    assert [e.id for e in await state.get_scheduled_effects()] == [kept]

    await due(app, tid)  # all three fall due, the cancelled ones first: had they been queued, they would have run first
    assert (await final(client, tid, kept))["status"] == "done"
    assert [r["effect"] for r in handled if "effect" in r] == ["probe"]
    statuses = {e["id"]: e["status"] for e in await listed(client, tid)}
    assert statuses == {by_http: "cancelled", by_state: "cancelled", kept: "done"}
    assert await stored(client, tid) == []

    finished = await client.post(f"/threads/{tid}/effects/{kept}/cancel")
    assert finished.status_code == 409 and finished.json()["error"]["code"] == "effect_not_cancellable"
    unknown = await client.post(f"/threads/{tid}/effects/{uuid.uuid4()}/cancel")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "effect_not_found"


async def test_a_handler_that_raises_is_failed_and_the_thread_goes_on(app_factory: Any) -> None:
    app, client, tid = await started(app_factory)
    state = await outside(app, tid)
    failing = await state.schedule_effect("boom", delay_ms=0)
    failed = await final(client, tid, failing)
    assert (failed["status"], failed["attempts"]) == ("failed", 1)
    assert failed["last_error"] == "RuntimeError: kaboom"
    await client.post(f"/threads/{tid}/messages", json={"content": "still there?"})
    await settle(client, tid)
    assert [r["content"] for r in await stored(client, tid)] == ["still there?", "noted: still there?"]
    # no retry: an effect left to run again would have run in this later execution, before its LLM call
    assert [r["effect"] for r in handled if "effect" in r] == ["boom"]


async def test_a_handler_error_never_shows_a_secret(app_factory: Any) -> None:
    app = await app_factory(catalog(), with_worker=True)
    client = client_for(app)
    body = {"agent": "agent", "env": {"TOKEN": "tok-very-secret"}, "secrets": ["TOKEN"]}
    tid = (await client.post("/threads", json=body)).json()["id"]
    state = await outside(app, tid)
    failed = await final(client, tid, await state.schedule_effect("boom", delay_ms=0))
    assert failed["last_error"] == "RuntimeError: kaboom ***"


async def test_a_crashed_handler_runs_again_and_at_most_three_times(app_factory: Any) -> None:
    app, client, tid = await started(app_factory, poll_interval=0.1)
    async with app.state.runtime.sessions() as session, session.begin():  # a worker died while running it, twice
        row = await effects.schedule(session, uuid.UUID(tid), "probe", {}, 60_000)
        row.status, row.attempts = effects.Status.RUNNING, 2
        session.add(tables.Inbox(thread_id=row.thread_id, kind="effect", payload={"effect_id": str(row.id)}))
        thread = await session.get(tables.Thread, row.thread_id)
        assert thread is not None
        thread.runnable_since = func.now()
        crashed = await effects.schedule(session, uuid.UUID(tid), "probe", {}, 60_000)
        crashed.status, crashed.attempts = effects.Status.RUNNING, 3
        session.add(tables.Inbox(thread_id=row.thread_id, kind="effect", payload={"effect_id": str(crashed.id)}))
    assert (await final(client, tid, str(row.id)))["status"] == "done"
    assert [r["context"]["effect"]["attempt"] for r in handled] == [3]
    gave_up = await final(client, tid, str(crashed.id))
    assert gave_up["status"] == "failed" and "crashed its worker 3 times" in gave_up["last_error"]


async def test_schedule_refuses_unknown_names_and_bad_arguments(app_factory: Any) -> None:
    app, _, tid = await started(app_factory)
    state = await outside(app, tid)
    with pytest.raises(errors.UnknownEffect, match=r"Unknown effect `nope`\. Defined effects: boom, ping, probe"):
        await state.schedule_effect("nope", {})
    with pytest.raises(errors.Invalid, match="invalid arguments for effect `ping`: `text`: Field required"):
        await state.schedule_effect("ping", {"txt": "x"})
    with pytest.raises(errors.Invalid, match="delay_ms"):
        await state.schedule_effect("ping", {"text": "x"}, -1)
    with pytest.raises(errors.Invalid, match="JSON"):
        await state.schedule_effect("ping", {"text": "x", "when": object()})
    assert await state.get_scheduled_effects() == []


async def test_terminating_a_thread_cancels_its_effects(app_factory: Any) -> None:
    app, client, tid = await started(app_factory)
    effect_id = await (await outside(app, tid)).schedule_effect("ping", {"text": "x"}, LATER_MS)
    assert (await client.post(f"/threads/{tid}/terminate")).status_code == 200
    assert [e["status"] for e in await listed(client, tid)] == ["cancelled"]
    await due(app, tid)
    other = (await client.post("/threads", json={"agent": "agent"})).json()["id"]  # due after it: the timer passed it
    assert (await final(client, other, await (await outside(app, other)).schedule_effect("probe")))["status"] == "done"
    assert [r["effect"] for r in handled] == ["probe"]
    with pytest.raises(errors.ThreadTerminated):
        await (await outside(app, tid)).schedule_effect("ping", {"text": "x"})
    assert effect_id


async def test_another_users_effects_are_not_found(app_factory: Any) -> None:
    app = await app_factory(catalog())
    async with app.state.runtime.sessions() as s, s.begin():
        _, alice = await keys.create(s, "alice", False)
        _, bob = await keys.create(s, "bob", False)
    async with client_for(app, alice) as a, client_for(app, bob) as b:
        tid = (await a.post("/threads", json={"agent": "agent"})).json()["id"]
        effect_id = await (await outside(app, tid)).schedule_effect("ping", {"text": "x"}, 60_000)
        assert [e["id"] for e in (await a.get(f"/threads/{tid}/effects")).json()["effects"]] == [effect_id]
        for response in (
            await b.get(f"/threads/{tid}/effects"),
            await b.post(f"/threads/{tid}/effects/{effect_id}/cancel"),
        ):
            assert response.status_code == 404 and response.json()["error"]["code"] == "thread_not_found"
        assert (await a.get(f"/threads/{uuid.uuid4()}/effects")).status_code == 404


async def test_the_example_assistant_sets_a_reminder(app_factory: Any) -> None:
    app = await app_factory(load(ROOT / "agents"), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "Remind me in 0.5 seconds to stretch."})

    async def reminded() -> list[dict[str, Any]] | None:
        rows = await stored(client, tid)
        return rows if rows[-1]["content"] == "Here is your reminder: stretch" else None

    rows = await wait_for(reminded)
    assert [(r["role"], r["content"]) for r in rows if r["role"] != "tool"] == [
        ("user", "Remind me in 0.5 seconds to stretch."),
        ("assistant", None),
        ("assistant", "Done: I will remind you."),
        ("user", "Reminder: stretch"),
        ("assistant", "Here is your reminder: stretch"),
    ]
    [effect] = await listed(client, tid)
    assert (effect["name"], effect["args"], effect["status"]) == ("remind", {"text": "stretch"}, "done")


def test_the_catalog_names_an_effect_after_its_file_and_checks_it(tmp_path: Path) -> None:
    (tmp_path / "effects").mkdir()
    (tmp_path / "effects" / "nudge.py").write_text(
        "from pydantic import BaseModel\nfrom app.spec import define_effect\n"
        "class Args(BaseModel):\n    text: str\n"
        "@define_effect(description='n')\nasync def send(state, args: Args): pass\n"
    )
    loaded = load(tmp_path)
    assert list(loaded.effects) == ["nudge"]
    assert (loaded.effects["nudge"].fn.__name__, loaded.effects["nudge"].description) == ("send", "n")
    (tmp_path / "effects" / "two.py").write_text(
        "from app.spec import define_effect\n"
        "@define_effect(description='a')\nasync def a(state): pass\n"
        "@define_effect(description='b')\nasync def b(state): pass\n"
    )
    (tmp_path / "effects" / "loose.py").write_text(
        "from app.spec import define_effect\n@define_effect(description='l')\nasync def l(state, args: dict): pass\n"
    )
    problems = {p.file.rsplit("/", 1)[-1]: p.message for p in check(tmp_path)}
    assert problems == {
        "loose.py": "TypeError on line 2: effect `l`: annotate `args` with a pydantic model class",
        "two.py": "defines 2 effects",
    }
