"""The tool phase (`app/engine/tool_phase.py`): with the prompt's `parallel_tool_calls` the calls of one answer run at
once and their results are stored in the order of the calls; without it, one after another."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import event

from app.catalog import Catalog
from app.spec import ThreadState, ToolResult, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for
from tests.test_engine import event_types, run, settle, stored


class MeetArgs(BaseModel):
    party: int  # how many calls meet
    wait: float = 3.0


class Meeting:
    """Calls that each wait until all of them have started: only calls that run at once can all meet."""

    def __init__(self) -> None:
        self.arrived = 0
        self.all_here = asyncio.Event()
        self.log: list[tuple[str, str]] = []


MEETING = Meeting()


@define_tool(description="Waits until every party of the meeting has arrived.")
async def meet(state: ThreadState, args: MeetArgs) -> str:
    assert state.execution is not None and state.execution.tool_call_id
    MEETING.log.append(("start", state.execution.tool_call_id))
    MEETING.arrived += 1
    if MEETING.arrived == args.party:
        MEETING.all_here.set()
    try:
        await asyncio.wait_for(MEETING.all_here.wait(), args.wait)
    finally:
        MEETING.log.append(("end", state.execution.tool_call_id))
    return f"met {args.party}"


class SleepArgs(BaseModel):
    seconds: float
    text: str


@define_tool(description="Sleeps, then says its text.")
async def sleep_then_say(state: ThreadState, args: SleepArgs) -> str:
    await asyncio.sleep(args.seconds)
    return args.text


@define_tool(description="Writes three files, one transaction each.")
async def write_three(state: ThreadState) -> str:
    assert state.execution is not None
    for i in range(3):
        await state.write_file(f"/out/{state.execution.tool_call_id}-{i}.txt", "x")
        await asyncio.sleep(0.01)  # the other calls' writes come in between
    return "written"


@define_tool(description="Refuses with a code.")
async def refuse_with_code(state: ThreadState) -> ToolResult:
    return ToolResult(status="error", error="over quota", error_code="quota", error_data={"left": 0})


def catalog(script: list[Any], *, parallel: bool) -> Catalog:
    tools = {t.name: t for t in (meet, sleep_then_say, write_three, refuse_with_code)}
    model = define_model(name="m", provider="test", script=script)
    p = define_prompt(
        name="p",
        model="m",
        prompt="Terse.",
        include_chat=True,
        include_past_tools=True,
        tools=list(tools),
        parallel_tool_calls=parallel,
    )
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(root=Path("."), models={"m": model}, prompts={"p": p}, agents={"agent": agent}, tools=tools)


def meeting_of(n: int, wait: float = 3.0) -> dict[str, Any]:
    return {"tool_calls": [{"name": "meet", "arguments": {"party": n, "wait": wait}} for _ in range(n)]}


async def test_the_calls_of_one_answer_run_at_once_when_the_prompt_allows_it(app_factory: Any, drive: Any) -> None:
    global MEETING
    MEETING = Meeting()
    client, tid = await run(app_factory, drive, catalog([meeting_of(3), "ok"], parallel=True), "meet")
    tools = [m for m in await stored(client, tid) if m["role"] == "tool"]
    assert [(t["tool_status"], t["content"]) for t in tools] == [("success", "met 3")] * 3
    starts = [kind for kind, _ in MEETING.log[:3]]
    assert starts == ["start"] * 3  # all three started before any ended
    names = [e for e, _ in await event_types(client, tid)]
    assert names.count("tool_started") == 3 and names.count("tool_completed") == 3
    assert names.index("tool_completed") > max(i for i, e in enumerate(names) if e == "tool_started")


async def test_without_parallel_tool_calls_they_run_one_after_another(app_factory: Any, drive: Any) -> None:
    global MEETING
    MEETING = Meeting()
    client, tid = await run(app_factory, drive, catalog([meeting_of(2, wait=0.3), "ok"], parallel=False), "meet")
    tools = [m for m in await stored(client, tid) if m["role"] == "tool"]
    # the first call waited alone and timed out; the second found the first already gone
    assert [t["tool_status"] for t in tools] == ["error", "success"]
    assert [kind for kind, _ in MEETING.log] == ["start", "end", "start", "end"]


async def test_results_are_stored_in_the_order_of_the_calls(app_factory: Any, drive: Any) -> None:
    calls = [
        {"name": "sleep_then_say", "arguments": {"seconds": 0.4, "text": "first (slow)"}},
        {"name": "sleep_then_say", "arguments": {"seconds": 0, "text": "second (fast)"}},
        {"name": "sleep_then_say", "arguments": {"seconds": 0.2, "text": "third"}},
    ]
    started = time.monotonic()
    client, tid = await run(app_factory, drive, catalog([{"tool_calls": calls}, "ok"], parallel=True), "go")
    assert time.monotonic() - started < 2  # together, not 0.6 s in a row plus the run; a loose bound, not a timing
    rows = await stored(client, tid)
    planned = [c["id"] for c in rows[1]["tool_calls"]]
    tools = [m for m in rows if m["role"] == "tool"]
    assert [t["tool_call_id"] for t in tools] == planned
    assert [t["content"] for t in tools] == ["first (slow)", "second (fast)", "third"]
    completed = [d["tool_call_id"] for e, d in await event_types(client, tid) if e == "tool_completed"]
    assert completed == planned
    logged = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]
    assert sorted(r["message_id"] for r in logged) == sorted(t["id"] for t in tools)  # one log row each


async def test_a_callables_error_code_is_kept_with_its_result_as_a_subagents_is(app_factory: Any, drive: Any) -> None:
    """Every path stores a result through `results.shape`/`write`: a callable's `error_code` and `error_data` go into
    its message's metadata, as a subagent's do (the callable path used to leave them out)."""
    cat = catalog([{"tool_calls": [{"name": "refuse_with_code"}]}, "ok"], parallel=False)
    client, tid = await run(app_factory, drive, cat, "go")
    tool = next(m for m in await stored(client, tid) if m["role"] == "tool")
    assert (tool["tool_status"], tool["content"]) == ("error", "over quota")
    assert tool["metadata"] == {"error_code": "quota", "error_data": {"left": 0}}
    [logged] = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]
    assert (logged["status"], logged["error"], logged["message_id"]) == ("error", "over quota", tool["id"])


async def test_calls_at_once_hold_one_connection_of_the_pool_at_a_time(app_factory: Any, drive: Any) -> None:
    """The transactions of one execution all lock the thread row: six calls writing at once take their turns
    without a connection each (which would only wait on the row while held: a worker's pool of DB_POOL_SIZE
    connections runs dry when many executions do it)."""
    cat = catalog([{"tool_calls": [{"name": "write_three"}] * 6}, "ok"], parallel=True)
    app = await app_factory(cat)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    assert (await client.post(f"/threads/{tid}/messages", json={"content": "go"})).status_code == 202
    pool = app.state.runtime.sessions.kw["bind"].sync_engine
    held = most = 0

    def out(*_: Any) -> None:
        nonlocal held, most
        held += 1
        most = max(most, held)

    def back(*_: Any) -> None:
        nonlocal held
        held -= 1

    event.listen(pool, "checkout", out)
    event.listen(pool, "checkin", back)
    try:
        await drive(app)
    finally:
        event.remove(pool, "checkout", out)
        event.remove(pool, "checkin", back)
    await settle(client, tid)
    tools = [m for m in await stored(client, tid) if m["role"] == "tool"]
    assert [t["content"] for t in tools] == ["written"] * 6
    listed = (await client.get(f"/threads/{tid}/fs/out")).json()
    assert len(listed["entries"]) == 18
    assert most == 1  # one for the execution, whatever its calls do at once (the harness claimed before)
