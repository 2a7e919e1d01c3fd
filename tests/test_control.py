"""Stop, continue and terminate (§11) over HTTP, against a worker running a slow model or a slow tool."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for, wait_for
from tests.test_engine import event_types, settle, stored

SLOW_S = 1.5


@define_tool(description="Sleeps a while.")
async def nap(state: ThreadState) -> str:
    await asyncio.sleep(SLOW_S)
    return "rested"


async def respond(request: LLMRequest) -> Any:
    """`slow` makes the call hang, `nap` calls the slow tool, anything else is answered at once."""
    last = request.messages[-1]
    if last.role == "user" and last.content == "slow":
        await asyncio.sleep(SLOW_S)
        return "too late"
    if last.role == "user" and last.content == "nap":
        return {"tool_calls": [{"name": "nap"}]}
    return f"answer to {last.role}: {last.content}"


def catalog() -> Catalog:
    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(
        name="p", model="m", prompt="Be brief.", include_chat=True, include_past_tools=True, tools=["nap"]
    )
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={"nap": nap}
    )


async def start(app_factory: Any) -> tuple[httpx.AsyncClient, str]:
    app = await app_factory(catalog(), with_worker=True)
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    return client, thread["id"]


async def until(client: httpx.AsyncClient, tid: str, check: Any) -> list[dict[str, Any]]:
    async def ready() -> list[dict[str, Any]] | None:
        rows = await stored(client, tid)
        return rows if check(rows) else None

    result: list[dict[str, Any]] = await wait_for(ready)
    return result


async def test_stop_aborts_a_slow_call_and_parks_the_thread(app_factory: Any) -> None:
    client, tid = await start(app_factory)
    await client.post(f"/threads/{tid}/messages", json={"content": "slow"})
    await until(client, tid, lambda rows: any(r["role"] == "assistant" and r["status"] == "pending" for r in rows))
    response = await client.post(f"/threads/{tid}/stop")
    assert response.status_code == 200
    assert response.json()["status"] == "stopped"
    assert response.json()["session"]["reason"] == "stopped_by_user"
    await asyncio.sleep(SLOW_S + 0.5)  # long enough for the aborted call to have answered, had it gone on
    rows = await stored(client, tid)
    assert [(r["role"], r["status"], r["content"]) for r in rows] == [
        ("user", "completed", "slow"),
        ("assistant", "failed", None),
        ("system", "completed", "Execution stopped by user"),
    ]
    names = [e for e, _ in await event_types(client, tid)]
    assert "stopped_by_user" in names and "llm_response" not in names
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "stopped"

    # queued input from a human ends the stop and runs
    await client.post(f"/threads/{tid}/messages", json={"content": "hello"})
    thread = await settle(client, tid)
    assert thread["session"]["number"] == 2 and thread["session"]["status"] == "running"
    assert (await stored(client, tid))[-1]["content"] == "answer to user: hello"


async def test_stop_answers_open_tool_calls_and_continue_runs_side_a(app_factory: Any) -> None:
    client, tid = await start(app_factory)
    await client.post(f"/threads/{tid}/messages", json={"content": "nap"})
    rows = await until(client, tid, lambda rows: any(r["role"] == "assistant" and r["tool_calls"] for r in rows))
    assert (await client.post(f"/threads/{tid}/stop")).status_code == 200
    rows = await stored(client, tid)
    call_id = next(r for r in rows if r["tool_calls"])["tool_calls"][0]["id"]
    result = next(r for r in rows if r["role"] == "tool")
    assert (result["tool_call_id"], result["tool_status"], result["content"]) == (
        call_id,
        "error",
        "Execution stopped by user",
    )
    await asyncio.sleep(SLOW_S + 0.5)
    assert [r["role"] for r in await stored(client, tid)].count("tool") == 1  # the aborted tool stored nothing

    # input that is not a human message waits while stopped
    await client.post(f"/threads/{tid}/messages", json={"content": "note", "role": "system"})
    await asyncio.sleep(0.5)
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "stopped"

    response = await client.post(f"/threads/{tid}/continue", json={})
    assert response.status_code == 202
    await settle(client, tid)
    rows = await stored(client, tid)
    assert rows[-2]["content"] == "note" and rows[-1]["content"] == "answer to system: note"


async def test_continue_validates_the_side(app_factory: Any) -> None:
    client, tid = await start(app_factory)
    response = await client.post(f"/threads/{tid}/continue", json={"side": "b"})
    assert response.status_code == 409  # well-formed, but this thread's agent has one side
    assert response.json()["error"]["code"] == "no_such_side"
    assert (await client.post(f"/threads/{tid}/continue", json={"side": "c"})).status_code == 422


async def test_terminate_aborts_and_refuses_later_input(app_factory: Any) -> None:
    client, tid = await start(app_factory)
    await client.post(f"/threads/{tid}/messages", json={"content": "slow"})
    await until(client, tid, lambda rows: any(r["role"] == "assistant" and r["status"] == "pending" for r in rows))
    response = await client.post(f"/threads/{tid}/terminate")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "terminated" and body["terminated_at"] is not None
    assert body["session"]["reason"] == "terminated"
    for path, payload in (("messages", {"content": "hi"}), ("continue", {}), ("stop", None)):
        denied = await client.post(f"/threads/{tid}/{path}", json=payload)
        assert denied.status_code == 409, path
        assert denied.json()["error"] == {"code": "thread_terminated", "message": "Thread is terminated"}
    assert (await client.post(f"/threads/{tid}/terminate")).status_code == 200
    await asyncio.sleep(SLOW_S + 0.5)
    rows = await stored(client, tid)
    assert [(r["role"], r["status"]) for r in rows] == [("user", "completed"), ("assistant", "failed")]
    assert "thread_terminated" in [e for e, _ in await event_types(client, tid)]


async def test_lifecycle_routes_answer_404_for_unknown_threads(app_factory: Any) -> None:
    client, _ = await start(app_factory)
    missing = "00000000-0000-0000-0000-000000000000"
    for path in ("stop", "continue", "terminate"):
        assert (await client.post(f"/threads/{missing}/{path}")).status_code == 404


async def test_input_posted_during_a_step_is_delivered_before_the_next_call(app_factory: Any) -> None:
    client, tid = await start(app_factory)
    await client.post(f"/threads/{tid}/messages", json={"content": "nap"})
    await until(client, tid, lambda rows: any(r["tool_calls"] for r in rows))
    await client.post(f"/threads/{tid}/messages", json={"content": "extra"})
    thread = await settle(client, tid)
    rows = await stored(client, tid)
    assert [(r["role"], r["content"]) for r in rows][2:] == [
        ("tool", "rested"),
        ("user", "extra"),
        ("assistant", "answer to user: extra"),
    ]
    assert thread["session"]["turns"] == 1  # mid-turn input joins the history; the turn goes on


async def test_a_real_deadlock_is_recognised_as_contention(app_factory: Any) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from app import errors

    app = await app_factory(catalog())
    client = client_for(app)
    a, b = [(await client.post("/threads", json={"agent": "agent"})).json()["id"] for _ in range(2)]
    lock = text("SELECT id FROM threads WHERE id = :id FOR UPDATE")
    first_locked, second_locked = asyncio.Event(), asyncio.Event()
    failures: list[BaseException] = []

    async def take(mine: str, other: str, locked: asyncio.Event, wait: asyncio.Event) -> None:
        try:
            async with app.state.runtime.sessions() as session, session.begin():
                await session.execute(lock, {"id": mine})
                locked.set()
                await wait.wait()
                await session.execute(lock, {"id": other})
        except DBAPIError as exc:
            failures.append(exc)

    await asyncio.gather(take(a, b, first_locked, second_locked), take(b, a, second_locked, first_locked))
    [failure] = failures  # Postgres broke the cycle by failing one of the two
    assert errors.Contention.of(failure)
