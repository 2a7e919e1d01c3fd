"""Tool execution: plain `def` tools in a worker thread, time limits, and control flow that no guard may swallow."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import text

from app import errors
from app.catalog import Catalog
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool
from app.spec.define import (
    BlockingState,
)  # what a plain `def` gets as `state`: its async methods called like plain ones
from tests.conftest import client_for, wait_for
from tests.test_engine import run, stored

LOOP_THREAD: dict[str, Any] = {}


@define_tool(description="Reads a variable from a worker thread.")
def blocking_whoami(state: BlockingState) -> str:
    LOOP_THREAD["tool"] = threading.get_ident()
    return f"{state.thread_id} says {state.env('GREETING')}"  # an async method, called like a plain one


class NapArgs(BaseModel):
    seconds: float


@define_tool(description="Sleeps in a worker thread.", timeout=0.15)
def blocking_nap(state: BlockingState, args: NapArgs) -> str:
    time.sleep(args.seconds)
    return "rested"


@define_tool(description="Writes after its time is up.", timeout=0.1)
def late_writer(state: BlockingState) -> str:
    time.sleep(0.3)
    try:
        state.set_status("late")
    except RuntimeError as exc:
        LATE["refused"] = str(exc)
    finally:
        LATE["tried"] = "yes"
    return "too late"


LATE: dict[str, str] = {}


@define_tool(description="Sleeps on the event loop.", timeout=0.15)
async def nap(state: ThreadState, args: NapArgs) -> str:
    await asyncio.sleep(args.seconds)
    return "rested"


@define_tool(description="Guards everything, as user code does.")
async def guarded(state: ThreadState) -> str:
    try:
        await GUARD["before"]()  # the test takes the lease away here
        await state.emit("still_mine", {})  # a fenced write: the lease is gone
    except Exception as exc:  # a careless guard around user code
        GUARD["swallowed"] = type(exc).__name__
        return f"swallowed {type(exc).__name__}"
    return "wrote"


GUARD: dict[str, Any] = {}
TOOLS = {t.name: t for t in (blocking_whoami, blocking_nap, nap, guarded, late_writer)}


def catalog(script: list[Any]) -> Catalog:
    model = define_model(name="m", provider="test", script=script)
    p = define_prompt(name="p", model="m", prompt="Terse.", include_chat=True, include_past_tools=True, tools=[*TOOLS])
    agent = define_agent(name="agent", side_a={"prompt": "p"}, env={"GREETING": "hi"})
    return Catalog(root=Path("."), models={"m": model}, prompts={"p": p}, agents={"agent": agent}, tools=TOOLS)


async def test_a_plain_def_tool_runs_in_a_worker_thread_and_calls_state_methods(app_factory: Any, drive: Any) -> None:
    client, tid = await run(app_factory, drive, catalog([{"tool_calls": [{"name": "blocking_whoami"}]}, "ok"]), "who?")
    tool = next(m for m in await stored(client, tid) if m["role"] == "tool")
    assert (tool["tool_status"], tool["content"]) == ("success", f"{tid} says hi")
    assert LOOP_THREAD["tool"] != threading.get_ident()


async def test_a_tool_past_its_time_limit_ends_with_an_error_result(app_factory: Any, drive: Any) -> None:
    calls = [{"name": name, "arguments": {"seconds": 2}} for name in ("nap", "blocking_nap")]
    client, tid = await run(app_factory, drive, catalog([{"tool_calls": calls}, "ok"]), "sleep")
    logged = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]
    ran = {row["tool"]: row["latency_ms"] for row in logged}  # how long each call ran, as the engine timed it
    assert ran.keys() == {"nap", "blocking_nap"} and all(ms < 1000 for ms in ran.values()), ran  # not their 2 s
    tools = [m for m in await stored(client, tid) if m["role"] == "tool"]
    assert [(t["tool_status"], t["content"]) for t in tools] == [
        ("error", "Tool `nap` did not finish within 0.15 s and was stopped"),
        ("error", "Tool `blocking_nap` did not finish within 0.15 s and was stopped"),
    ]


async def test_a_plain_def_tool_left_running_after_its_time_limit_cannot_write(app_factory: Any, drive: Any) -> None:
    LATE.clear()
    client, tid = await run(app_factory, drive, catalog([{"tool_calls": [{"name": "late_writer"}]}, "ok"]), "go")
    await wait_for(lambda: asyncio.sleep(0, "tried" in LATE))  # the thread woke up and tried to write
    assert LATE["refused"] == "`state.set_status`: this call has ended (it ran past its time limit)"
    assert (await client.get(f"/threads/{tid}")).json()["session"]["status_text"] is None


async def test_the_server_tool_timeout_applies_to_tools_without_their_own(app_factory: Any, drive: Any) -> None:
    slow = {"name": "blocking_whoami"}
    app = await app_factory(catalog([{"tool_calls": [slow]}, "ok"]), tool_timeout=0.1)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    original = blocking_whoami.fn

    async def slower(state: Any) -> Any:
        await asyncio.sleep(2)
        return await original(state)

    blocking_whoami.fn = slower
    try:
        await client.post(f"/threads/{tid}/messages", json={"content": "who?"})
        await drive(app)
    finally:
        blocking_whoami.fn = original
    tool = next(m for m in await stored(client, tid) if m["role"] == "tool")
    assert tool["content"] == "Tool `blocking_whoami` did not finish within 0.1 s and was stopped"


async def test_a_lost_lease_inside_a_tool_is_not_swallowed_by_its_guard(app_factory: Any, drive: Any) -> None:
    """LeaseLost is control flow: a tool's `except Exception` cannot turn it into a result the model would see."""
    app = await app_factory(catalog([{"tool_calls": [{"name": "guarded"}]}, "ok"]))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]

    async def steal() -> None:
        async with app.state.runtime.sessions() as session, session.begin():
            thief = {"t": uuid.uuid4(), "id": uuid.UUID(tid)}
            await session.execute(text("UPDATE threads SET lease_token = :t WHERE id = :id"), thief)
            await session.execute(text("UPDATE leases SET token = :t WHERE thread_id = :id"), thief)

    GUARD["before"] = steal
    GUARD.pop("swallowed", None)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    assert await drive(app) == [uuid.UUID(tid)]  # the execution ran, and ended: nothing more it could write
    assert "swallowed" not in GUARD  # the guard never saw it (its result could not have been stored anyway)
    rows = await stored(client, tid)
    assert [m["role"] for m in rows] == ["user", "assistant"]  # no tool result stored, nothing after it
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "running"  # left to whoever holds the lease


async def test_a_lock_cycle_inside_a_tool_redoes_the_call_instead_of_becoming_its_result(
    app_factory: Any, drive: Any
) -> None:
    """A state call that hits a deadlock raises `Contention`; the tool's guard cannot store it as the result: the
    execution is handed back and the call is made again."""
    tries: list[str] = []

    async def deadlock_once() -> None:
        tries.append("try")
        if len(tries) == 1:
            raise errors.Contention()  # what a fenced transaction raises when Postgres breaks a lock cycle

    GUARD["before"] = deadlock_once
    client, tid = await run(app_factory, drive, catalog([{"tool_calls": [{"name": "guarded"}]}, "ok"]), "go")
    tools = [m["content"] for m in await stored(client, tid) if m["role"] == "tool"]
    assert (tools, len(tries)) == (["wrote"], 2)
