"""Scripted runs of the `ai_human` engine: stored messages, events and session fields per scenario."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from sqlalchemy import text as sql

from app import events
from app.catalog import Catalog
from app.spec import ThreadState, ToolResult, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for, wait_for


class AddArgs(BaseModel):
    a: int
    b: int


@define_tool(description="Add two integers.")
async def add(state: ThreadState, args: AddArgs) -> str:
    assert state.execution is not None and state.execution.tool_call_id
    return str(args.a + args.b)


@define_tool(description="Always fails.")
async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


@define_tool(description="Returns a structured error.")
async def refuse(state: ThreadState) -> ToolResult:
    return ToolResult(status="error", error="not allowed")


@define_tool(description="Reads a variable.")
async def whoami(state: ThreadState) -> dict[str, str]:
    return {"thread": state.thread_id, "greeting": await state.env("GREETING")}


def catalog(script: list[Any], side: dict[str, Any] | None = None, **prompt: Any) -> Catalog:
    tools = {t.name: t for t in (add, explode, refuse, whoami)}
    model = define_model(name="m", provider="test", script=script, chunk_size=3)
    p = define_prompt(
        name="p",
        tool_description="t",
        model="m",
        prompt="You are terse.",
        include_chat=True,
        include_past_tools=True,
        tools=list(tools),
        **prompt,
    )
    agent = define_agent(name="agent", side_a={"prompt": "p", **(side or {})}, env={"GREETING": "hi"})
    return Catalog(root=Path("."), models={"m": model}, prompts={"p": p}, agents={"agent": agent}, tools=tools)


async def run(app_factory: Any, drive: Any, cat: Catalog, *messages: str) -> tuple[httpx.AsyncClient, str]:
    """Post `messages` to a new thread and run its turn to the end (no worker: `drive`)."""
    app = await app_factory(cat)
    client = client_for(app)
    created = (await client.post("/threads", json={"agent": "agent"})).json()
    for text in messages:
        assert (await client.post(f"/threads/{created['id']}/messages", json={"content": text})).status_code == 202
    await drive(app)
    await settle(client, created["id"])
    return client, created["id"]


async def settle(client: httpx.AsyncClient, thread_id: str) -> dict[str, Any]:
    async def idle() -> dict[str, Any] | None:
        thread: dict[str, Any] = (await client.get(f"/threads/{thread_id}")).json()
        return thread if thread["status"] == "idle" and thread["session"]["number"] > 0 else None

    result: dict[str, Any] = await wait_for(idle)
    return result


async def stored(client: httpx.AsyncClient, thread_id: str) -> list[dict[str, Any]]:
    body = (await client.get(f"/threads/{thread_id}/messages", params={"include_silent": True})).json()
    return list(body["messages"])


async def event_types(client: httpx.AsyncClient, thread_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The thread's stored events (the SSE route streams these; `test_api.py` covers the stream)."""
    app: Any = client._transport.app  # type: ignore[attr-defined]
    async with app.state.runtime.sessions() as session:
        rows = await events.read(session, uuid.UUID(thread_id), 0)
    return [(r.type, r.data) for r in rows]


async def test_tool_call_then_reply(app_factory: Any, drive: Any) -> None:
    cat = catalog([{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}, "It is 5."])
    client, tid = await run(app_factory, drive, cat, "2+3?")
    rows = await stored(client, tid)
    assert [(m["role"], m["side"], m["status"]) for m in rows] == [
        ("user", "b", "completed"),
        ("assistant", "a", "completed"),
        ("tool", "a", "completed"),
        ("assistant", "a", "completed"),
    ]
    assert rows[1]["tool_calls"][0]["function"]["name"] == "add"
    assert rows[2]["content"] == "5" and rows[2]["tool_status"] == "success"
    assert rows[2]["tool_call_id"] == rows[1]["tool_calls"][0]["id"]
    assert rows[3]["content"] == "It is 5."
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"] == {
        "number": 1,
        "turns": 1,
        "status": "running",
        "reason": None,
        "result": None,
        "status_text": None,
    }
    events = await event_types(client, tid)
    names = [e for e, _ in events]
    assert names.index("step_started") < names.index("tool_started") < names.index("tool_completed")
    assert ("turn_ended", {"side": "a", "reason": "stop_on_response"}) in events


async def test_bad_arguments_and_raising_tools_become_error_results(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.engine.tools")
    cat = catalog(
        [
            {
                "tool_calls": [
                    {"name": "add", "arguments": {"a": "x"}},
                    {"name": "explode"},
                    {"name": "refuse"},
                    {"name": "nope"},
                ]
            },
            "Sorry.",
        ]
    )
    client, tid = await run(app_factory, drive, cat, "go")
    tools = [m for m in await stored(client, tid) if m["role"] == "tool"]
    assert [t["tool_status"] for t in tools] == ["error"] * 4
    assert "Invalid arguments for tool `add`" in tools[0]["content"] and "`a`" in tools[0]["content"]
    assert "`b`" in tools[0]["content"]
    assert tools[1]["content"] == "Tool `explode` failed: RuntimeError: kaboom"
    assert tools[2]["content"] == "not allowed"
    assert tools[3]["content"].startswith("Unknown tool `nope`")
    warned = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "app.engine.tools"]
    assert warned == [("WARNING", f"thread {tid}: tool explode raised RuntimeError")]  # the text may hold a secret


async def test_an_exception_escaping_a_step_is_logged_as_an_error_with_the_thread(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in agent code the engine does not wrap (here a `respond` function) fails the session, says so in an
    `error` event, and is logged at ERROR with the thread id and the traceback."""

    def respond(request: Any) -> str:
        raise LookupError("no such row")

    cat = catalog([])
    cat = dataclasses.replace(cat, models={"m": cat.models["m"].model_copy(update={"respond": respond})})
    caplog.set_level(logging.ERROR, logger="app.engine.run")
    client, tid = await run(app_factory, drive, cat, "hi")
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["session"]["status"], thread["session"]["reason"]) == ("failure", "crashed")
    error = {"code": "internal_error", "message": "LookupError: no such row"}
    assert ("error", error) in await event_types(client, tid)
    [record] = [r for r in caplog.records if r.name == "app.engine.run"]
    assert record.levelno == logging.ERROR and record.getMessage() == f"execution of thread {tid} failed"
    assert record.exc_info and isinstance(record.exc_info[1], LookupError)


def _turn_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "app.engine.run" and r.levelno == logging.INFO]


async def test_one_info_line_per_turn_with_its_steps_tokens_cost_duration_and_outcome(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Said once the turn's closing transaction committed; counted from the requests' log rows, no extra query."""
    caplog.set_level(logging.INFO, logger="app.engine.run")
    script = [
        {"tool_calls": [{"name": "whoami"}], "usage": {"input_tokens": 1000, "output_tokens": 20}},
        {"text": "It is done.", "usage": {"input_tokens": 1500, "output_tokens": 30}},
        {"text": "Again.", "usage": {"input_tokens": 10, "output_tokens": 2}},
    ]
    cat = catalog(script)
    priced = cat.models["m"].model_copy(update={"input_price": 3.0, "output_price": 15.0})  # USD per million tokens
    cat = dataclasses.replace(cat, models={"m": priced})
    client, tid = await run(app_factory, drive, cat, "tell me about s3cret-words")
    [line] = _turn_lines(caplog)
    fields = dict(word.split("=", 1) for word in line.removeprefix("turn ended: ").split())
    assert fields.pop("duration_s").replace(".", "").isdigit()
    assert fields == {
        "thread": tid,
        "agent": "agent",
        "side": "a",
        "steps": "2",
        "requests": "2",
        "tokens_in": "2500",
        "tokens_out": "50",
        "cost_usd": f"{(2500 * 3.0 + 50 * 15.0) / 1e6:.6f}",
        "outcome": "stop_on_response",
    }
    assert "s3cret" not in caplog.text and "hi" not in line  # no message text, no variable (GREETING is "hi")
    caplog.clear()
    await client.post(f"/threads/{tid}/messages", json={"content": "again"})
    await drive(client._transport.app)  # type: ignore[attr-defined]
    await settle(client, tid)
    [line] = _turn_lines(caplog)  # the next turn counts from its own start
    assert " steps=1 requests=1 tokens_in=10 tokens_out=2 cost_usd=0.000060 " in line


async def test_a_turn_that_fails_or_crashes_says_so_in_its_line(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.engine.run")
    _, tid = await run(app_factory, drive, catalog([{"error": "bad request", "status": 400}]), "hi")
    [line] = _turn_lines(caplog)
    assert f"thread={tid} " in line and " cost_usd=unknown " in line  # the model has no prices
    assert line.endswith(" outcome=llm_error session=failure") and " requests=1 tokens_in=0 " in line

    def respond(request: Any) -> str:
        raise LookupError("no such row")

    cat = catalog([])
    cat = dataclasses.replace(cat, models={"m": cat.models["m"].model_copy(update={"respond": respond})})
    caplog.clear()
    _, tid = await run(app_factory, drive, cat, "hi")
    [line] = _turn_lines(caplog)
    assert f"thread={tid} " in line and line.endswith(" outcome=crashed session=failure")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"execution of thread {tid} failed"
    ]  # and the crash itself, once


async def test_tools_see_env_and_identity(app_factory: Any, drive: Any) -> None:
    cat = catalog([{"tool_calls": [{"name": "whoami"}]}, "ok"])
    client, tid = await run(app_factory, drive, cat, "who?")
    tool = next(m for m in await stored(client, tid) if m["role"] == "tool")
    assert tool["content"] == f'{{"thread": "{tid}", "greeting": "hi"}}'


async def test_stop_tool_ends_the_turn_with_its_response_property(app_factory: Any, drive: Any) -> None:
    cat = catalog(
        [{"text": "thinking", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}],
        side={"stop_tool": "add", "stop_tool_response_property": "a", "stop_on_response": False},
    )
    client, tid = await run(app_factory, drive, cat, "go")
    rows = await stored(client, tid)
    assert [m["role"] for m in rows] == ["user", "assistant", "tool"]
    events = await event_types(client, tid)
    assert ("turn_ended", {"side": "a", "reason": "stop_tool"}) in events


async def test_max_steps_ends_the_turn(app_factory: Any, drive: Any) -> None:
    call = {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}
    client, tid = await run(app_factory, drive, catalog([call, call, call], side={"max_steps": 2}), "loop")
    assert [m["role"] for m in await stored(client, tid)] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert ("turn_ended", {"side": "a", "reason": "max_steps"}) in await event_types(client, tid)


async def test_session_stop_tool_ends_the_session_with_its_payload(app_factory: Any, drive: Any) -> None:
    done = {"tool_calls": [{"name": "finish", "arguments": {"summary": "all good"}}]}
    side = {"session_stop": {"name": "finish", "message_property": "summary"}, "stop_on_response": False}
    client, tid = await run(app_factory, drive, catalog([done], side=side), "do it")
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["status"] == "success"
    assert thread["session"]["reason"] == "session_stop"
    assert thread["session"]["result"] == {"content": "all good", "attachments": []}


async def test_provider_error_fails_the_session_and_marks_the_message(app_factory: Any, drive: Any) -> None:
    client, tid = await run(app_factory, drive, catalog([{"error": "bad request", "status": 400}]), "hi")
    rows = await stored(client, tid)
    assert rows[-1]["role"] == "assistant" and rows[-1]["status"] == "failed"
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["status"] == "failure" and thread["session"]["reason"] == "llm_error"
    assert ("error", {"code": "llm_error", "message": "bad request"}) in await event_types(client, tid)


async def test_empty_response_is_asked_again_once(app_factory: Any, drive: Any) -> None:
    client, tid = await run(app_factory, drive, catalog(["", "second try"]), "hi")
    assert (await stored(client, tid))[-1]["content"] == "second try"


async def test_twice_empty_response_ends_the_turn(app_factory: Any, drive: Any) -> None:
    client, tid = await run(app_factory, drive, catalog(["", ""]), "hi")
    assert ("turn_ended", {"side": "a", "reason": "empty_response"}) in await event_types(client, tid)


async def test_global_step_cap_fails_the_session(app_factory: Any, drive: Any) -> None:
    call = {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}]}
    cat = catalog([call] * 5, side={"stop_on_response": False})
    app = await app_factory(cat, max_session_steps=3)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    await drive(app)
    thread = await settle(client, tid)
    assert thread["session"]["reason"] == "max_total_steps" and thread["session"]["status"] == "failure"
    assert len([m for m in await stored(client, tid) if m["role"] == "assistant"]) == 3


async def test_the_model_sees_history_in_order(app_factory: Any, drive: Any) -> None:
    seen: list[list[tuple[str, str | None]]] = []

    def respond(request: Any) -> str:
        seen.append([(m.role, m.content) for m in request.messages])
        return f"reply {len(seen)}"

    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", tool_description="t", model="m", prompt="sys", include_chat=True)
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    cat = Catalog(root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={})
    app = await app_factory(cat)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "one"})
    await drive(app)
    await settle(client, tid)
    await client.post(f"/threads/{tid}/messages", json={"content": "two"})
    await drive(app)
    assert len(seen) == 2 and (await client.get(f"/threads/{tid}")).json()["status"] == "idle"
    assert seen[1] == [("system", "sys"), ("user", "one"), ("assistant", "reply 1"), ("user", "two")]


@pytest.mark.parametrize("include_chat", [False])
async def test_without_include_chat_a_turn_sees_only_itself(app_factory: Any, drive: Any, include_chat: bool) -> None:
    seen: list[list[str | None]] = []

    def respond(request: Any) -> str:
        seen.append([m.content for m in request.messages])
        return "ok"

    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", tool_description="t", model="m", prompt="sys", include_chat=include_chat)
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    cat = Catalog(root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={})
    client, tid = await run(app_factory, drive, cat, "one")
    await client.post(f"/threads/{tid}/messages", json={"content": "two"})
    await drive(client._transport.app)  # type: ignore[attr-defined]
    assert len(seen) == 2
    assert seen[1] == ["sys", "two"]


async def test_a_turn_of_replies_takes_the_script_in_order(app_factory: Any, drive: Any) -> None:
    # each step's log row goes with its closing transaction's events, and the next step opens in that transaction:
    # the script position counts the row before it is sent on its own
    cat = catalog(["one", "two", "three"], side={"stop_on_response": False, "max_steps": 3})
    client, tid = await run(app_factory, drive, cat, "go")
    assert [m["content"] for m in await stored(client, tid) if m["role"] == "assistant"] == ["one", "two", "three"]
    assert ("turn_ended", {"side": "a", "reason": "max_steps"}) in await event_types(client, tid)
    app: Any = client._transport.app  # type: ignore[attr-defined]
    async with app.state.runtime.sessions() as session:
        logged = (await session.execute(sql("SELECT count(*) FROM logs WHERE thread_id = :t"), {"t": tid})).scalar()
    assert logged == 3


async def test_script_position_is_durable_across_workers(app_factory: Any, drive: Any) -> None:
    cat = catalog(["first", "second"])
    client, tid = await run(app_factory, drive, cat, "one")
    # a new process (app + worker) picks the thread up again: the script continues, it does not restart
    app2 = await app_factory(cat, with_worker=True)
    client2 = client_for(app2)
    await client2.post(f"/threads/{tid}/messages", json={"content": "two"})

    async def answered() -> bool:
        done = [m for m in await stored(client2, tid) if m["role"] == "assistant" and m["status"] == "completed"]
        return len(done) == 2

    await wait_for(answered)
    assert [m["content"] for m in await stored(client2, tid) if m["role"] == "assistant"] == ["first", "second"]
    assert client is not None


async def test_each_tool_call_writes_a_log_row_with_its_secrets_masked(app_factory: Any, drive: Any) -> None:
    quoted = 'pa"ss\\wörd'  # a secret JSON escapes in the arguments' text
    calls = [
        {"name": "add", "arguments": {"a": 2, "b": 3}},
        {"name": "explode", "arguments": {"token": "s3cr3t-val"}},
        {"name": "nope", "arguments": {}},
        {"name": "x" * 300, "arguments": {"pin": quoted}},  # a made-up name wider than `logs.tool`
    ]
    app = await app_factory(catalog([{"tool_calls": calls}, "done"]))
    client = client_for(app)
    body = {"agent": "agent", "env": {"TOKEN": "s3cr3t-val", "PIN": quoted}, "secrets": ["TOKEN", "PIN"]}
    tid = (await client.post("/threads", json=body)).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    await drive(app)
    await settle(client, tid)
    response = await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})
    assert response.status_code == 200, response.text
    rows = response.json()["logs"]
    assert sorted(r["tool"] for r in rows) == ["add", "explode", "nope", "x" * 200]  # the turn went on
    by_tool = {r["tool"]: r for r in rows}
    results = {m["tool_call_id"]: m["id"] for m in await stored(client, tid) if m["role"] == "tool"}
    for row in rows:
        assert row["kind"] == "tool" and row["model"] is None and row["latency_ms"] >= 0
        assert row["message_id"] == results[row["request"]["tool_call_id"]]  # the result message it wrote
    assert (by_tool["add"]["status"], by_tool["add"]["error"]) == ("success", None)
    assert by_tool["add"]["request"]["arguments"] == '{"a": 2, "b": 3}'
    assert by_tool["add"]["request"]["arguments_bytes"] == len('{"a": 2, "b": 3}')
    explode_row = by_tool["explode"]
    assert explode_row["status"] == "error" and explode_row["error"] == "Tool `explode` failed: RuntimeError: kaboom"
    assert explode_row["request"]["arguments"] == '{"token": "***"}'  # a known secret value never reaches a log
    assert explode_row["request"]["arguments_bytes"] == len('{"token": "s3cr3t-val"}')
    assert by_tool["nope"]["status"] == "error" and by_tool["nope"]["error"].startswith("Unknown tool `nope`")
    assert by_tool["x" * 200]["request"]["arguments"] == '{"pin": "***"}'  # masked as JSON spells it too
    everything = (await client.get(f"/threads/{tid}/logs")).json()["logs"]
    assert [r["kind"] for r in everything].count("llm") == 2 and "s3cr3t-val" not in str(everything)
