"""Stop, continue and terminate (§11) over HTTP, against a worker running a slow model or a slow tool: both hang until
the test releases them (`release`), so a test decides what is still running when it stops a thread, and never waits
for a fixed time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for, wait_for
from tests.test_engine import event_types, settle, stored

LEASE_S = 30
release = asyncio.Event()  # set by a test: the slow call answers, the slow tool returns


@pytest.fixture(autouse=True)
def _hold() -> None:
    global release
    release = asyncio.Event()  # one per test: an event is bound to the loop that first waits on it


@define_tool(description="Sleeps until released.")
async def nap(state: ThreadState) -> str:
    await release.wait()
    return "rested"


async def respond(request: LLMRequest) -> Any:
    """`slow` makes the call hang until released, `nap` calls the slow tool, anything else is answered at once."""
    last = request.messages[-1]
    if last.role == "user" and last.content == "slow":
        await release.wait()
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
    # a lease far longer than any test here: a stopped execution that ends at all was ended by the stop's notice, not
    # by its heartbeat finding the lease gone (a third of a lease later), as `ended` requires
    app = await app_factory(catalog(), with_worker=True, lease_seconds=LEASE_S)
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    return client, thread["id"]


async def until(client: httpx.AsyncClient, tid: str, check: Any) -> list[dict[str, Any]]:
    async def ready() -> list[dict[str, Any]] | None:
        rows = await stored(client, tid)
        return rows if check(rows) else None

    result: list[dict[str, Any]] = await wait_for(ready)
    return result


def execution(tid: str) -> asyncio.Task[Any]:
    """The worker's task executing the thread (the worker runs in the test's event loop, and names it)."""
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == f"thread-{tid}" and not t.done()]
    return task


async def ended(task: asyncio.Task[Any]) -> None:
    """Wait for an execution to end while its model call or tool still hangs: it was aborted, and whatever it had
    left to do can no longer happen."""
    await asyncio.wait({task}, timeout=LEASE_S / 6)
    assert task.done(), "the execution went on after the thread was stopped"
    release.set()  # had anything of it still been waiting, it would go on now


async def in_slow_call(client: httpx.AsyncClient, tid: str) -> asyncio.Task[Any]:
    """Post a message whose model call hangs, and return the execution once it waits in that call."""
    await client.post(f"/threads/{tid}/messages", json={"content": "slow"})
    await until(client, tid, lambda rows: any(r["role"] == "assistant" and r["status"] == "pending" for r in rows))
    return execution(tid)


async def worker_ran_since(client: httpx.AsyncClient) -> None:
    """A new thread's message is answered: the worker has claimed runnable threads since this was called, and would
    have claimed any other thread that was runnable by then."""
    other = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{other}/messages", json={"content": "ping"})
    await settle(client, other)


async def test_stop_aborts_a_slow_call_and_parks_the_thread(app_factory: Any) -> None:
    client, tid = await start(app_factory)
    running = await in_slow_call(client, tid)
    response = await client.post(f"/threads/{tid}/stop")
    assert response.status_code == 200
    assert response.json()["status"] == "stopped"
    assert response.json()["session"]["reason"] == "stopped_by_user"
    await ended(running)
    rows = await stored(client, tid)
    assert [(r["role"], r["status"], r["content"]) for r in rows] == [
        ("user", "completed", "slow"),
        ("assistant", "failed", None),
        ("system", "completed", "Execution stopped by user"),
    ]
    assert rows[1]["metadata"]["error"] == {"code": "stopped_by_user", "message": "Execution stopped by user"}
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
    running = execution(tid)
    assert (await client.post(f"/threads/{tid}/stop")).status_code == 200
    rows = await stored(client, tid)
    call_id = next(r for r in rows if r["tool_calls"])["tool_calls"][0]["id"]
    result = next(r for r in rows if r["role"] == "tool")
    assert (result["tool_call_id"], result["tool_status"], result["content"]) == (
        call_id,
        "error",
        "Execution stopped by user",
    )
    await ended(running)
    assert [r["role"] for r in await stored(client, tid)].count("tool") == 1  # the aborted tool stored nothing

    # input that is not a human message waits while stopped
    await client.post(f"/threads/{tid}/messages", json={"content": "note", "role": "system"})
    await worker_ran_since(client)
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "stopped"
    assert "answer to system: note" not in [r["content"] for r in await stored(client, tid)]

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
    running = await in_slow_call(client, tid)
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
    await ended(running)
    rows = await stored(client, tid)
    assert [(r["role"], r["status"]) for r in rows] == [("user", "completed"), ("assistant", "failed")]
    assert rows[1]["metadata"]["error"] == {"code": "terminated", "message": "Thread terminated"}
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
    release.set()  # the tool returns only once the input is stored
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
    async with app.state.runtime.sessions() as session:
        # Postgres looks for a deadlock after `deadlock_timeout` (1 s by default); a superuser may look sooner
        superuser = (await session.execute(text("SELECT current_setting('is_superuser')"))).scalar_one() == "on"

    async def take(mine: str, other: str, locked: asyncio.Event, wait: asyncio.Event) -> None:
        try:
            async with app.state.runtime.sessions() as session, session.begin():
                if superuser:
                    await session.execute(text("SET LOCAL deadlock_timeout = '100ms'"))
                await session.execute(lock, {"id": mine})
                locked.set()
                await wait.wait()
                await session.execute(lock, {"id": other})
        except DBAPIError as exc:
            failures.append(exc)

    await asyncio.gather(take(a, b, first_locked, second_locked), take(b, a, second_locked, first_locked))
    [failure] = failures  # Postgres broke the cycle by failing one of the two
    assert errors.Contention.of(failure)
