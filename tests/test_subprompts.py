"""Subprompts (§7.2): a prompt offered as a tool runs one step in the caller's thread, one level deeper."""

from __future__ import annotations

import base64
import dataclasses
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import func, select

from app import errors, events, messages, queue, tables
from app.catalog import Catalog
from app.engine import subprompts, types
from app.llm.base import LLMRequest
from app.spec import (
    StateMessage,
    ThreadState,
    ToolAttachment,
    ToolEntry,
    ToolResult,
    define_agent,
    define_hook,
    define_model,
    define_prompt,
    define_tool,
)
from app.spec.messages import ToolCall
from tests import harness, test_engine_run, test_subagents
from tests.conftest import client_for
from tests.test_engine import stored
from tests.tools import add


@define_tool(description="Always fails.")
async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


@define_tool(description="Invokes the helper subprompt.")
async def invoker(state: ThreadState) -> str:
    result = await state.invoke_tool("helper", {"message": "from a tool"})
    return f"{result.status}: {result.text}"


class Recorder:
    """A `test` model's `respond`: answers with `replies` in order (then `done`) and keeps every request."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.requests: list[LLMRequest] = []

    def __call__(self, request: LLMRequest) -> Any:
        self.requests.append(request)
        n = len(self.requests)
        return self.replies[n - 1] if n <= len(self.replies) else "done"

    def seen(self, index: int = -1) -> list[tuple[str, str | None]]:
        return [(m.role, m.content) for m in self.requests[index].messages]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


class Query(BaseModel):
    query: str
    limit: int = 3


def catalog(main: Recorder, sub: Recorder, entry: str | dict[str, Any] = "helper", **helper: Any) -> Catalog:
    tools = {t.name: t for t in (add, explode, invoker)}
    models = {
        "m": define_model(name="m", provider="test", respond=main),
        "s": define_model(name="s", provider="test", respond=sub, chunk_size=2),
    }
    prompts = {
        "p": define_prompt(
            name="p",
            model="m",
            prompt="You coordinate.",
            include_chat=True,
            include_past_tools=True,
            tools=[entry, "add", "invoker", "search"],
        ),
        "helper": define_prompt(
            **{
                "name": "helper",
                "tool_description": "Polishes text.",
                "model": "s",
                "prompt": "You polish.",
                "tools": ["add", "explode"],
                **helper,
            }
        ),
        "search": define_prompt(
            name="search", tool_description="Searches.", model="s", prompt="You search.", required_schema=Query
        ),
    }
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(root=Path("."), models=models, prompts=prompts, agents={"agent": agent}, tools=tools)


async def start(app_factory: Any, cat: Catalog) -> tuple[FastAPI, httpx.AsyncClient, str]:
    """An app without a worker (`say` runs its turns) and a new thread of `agent`."""
    app: FastAPI = await app_factory(cat)
    client = client_for(app)
    created = await client.post("/threads", json={"agent": "agent"})
    assert created.status_code == 201, created.text
    return app, client, created.json()["id"]


async def say(drive: Any, client: httpx.AsyncClient, tid: str, content: str) -> None:
    """Post `content` and run the thread's turn to its end (`drive`)."""
    assert (await client.post(f"/threads/{tid}/messages", json={"content": content})).status_code == 202
    await drive(client._transport.app)  # type: ignore[attr-defined]
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["status"] == "idle" and thread["session"]["number"] >= 1, thread


async def listed(client: httpx.AsyncClient, tid: str, depth: int = 0) -> list[dict[str, Any]]:
    body = (await client.get(f"/threads/{tid}/messages", params={"depth": depth})).json()
    return list(body["messages"])


def result_of(rows: list[dict[str, Any]], name: str = "helper") -> dict[str, Any]:
    return next(m for m in rows if m["role"] == "tool" and m["name"] == name and m["depth"] == 0)


async def test_offered_as_a_tool_with_its_schema(app_factory: Any, drive: Any) -> None:
    main = Recorder("hi")
    _, client, tid = await start(app_factory, catalog(main, Recorder()))
    await say(drive, client, tid, "hello")
    offered = {t.name: (t.description, t.parameters) for t in main.requests[0].tools}
    assert offered["helper"] == (
        "Polishes text.",
        {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "attachments": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "paths of files of this thread to attach",
                },
            },
            "required": ["message"],
            "additionalProperties": False,
        },
    )
    description, schema = offered["search"]
    assert description == "Searches."
    assert schema["required"] == ["query"] and set(schema["properties"]) == {"query", "limit"}
    assert schema["additionalProperties"] is False


async def test_one_step_in_the_same_thread_one_level_deeper(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("helper", message="polish: hi there"), "Sent.")
    sub = Recorder("Hi there!")
    _, client, tid = await start(app_factory, catalog(main, sub))
    await say(drive, client, tid, "write hi")
    top = await listed(client, tid)
    assert [(m["role"], m["depth"]) for m in top] == [("user", 0), ("assistant", 0), ("tool", 0), ("assistant", 0)]
    assert result_of(top)["content"] == "Hi there!" and result_of(top)["tool_status"] == "success"
    everything = await listed(client, tid, depth=1)
    caller = everything[1]
    deeper = [m for m in everything if m["depth"] == 1]
    assert [(m["role"], m["content"], m["status"]) for m in deeper] == [
        ("user", "polish: hi there", "completed"),
        ("assistant", "Hi there!", "completed"),
    ]
    assert all(m["parent_id"] == caller["id"] for m in deeper)
    assert deeper[1]["model"] == "s" and deeper[1]["side"] == "a"
    # the subprompt's call: its own system prompt and tools, no chat (include_chat is false by default)
    assert sub.seen(0) == [("system", "You polish."), ("user", "polish: hi there")]
    assert [t.name for t in sub.requests[0].tools] == ["add", "explode"]
    # the caller's next call sees the result as the tool's answer, not the subprompt's own messages
    assert main.seen(1)[-1] == ("tool", "Hi there!")
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["status"] == "running" and thread["session"]["turns"] == 1


ERRORS = "Errors:\n- explode {} → Tool `explode` failed: RuntimeError: kaboom"
FULL = f'Here.\n\nTool calls:\n- add {{"a": 1, "b": 2}} → 3\n\n{ERRORS}'


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, FULL),
        ({"include_text_response": False}, FULL.removeprefix("Here.\n\n")),
        ({"include_tool_calls": False}, f"Here.\n\n{ERRORS}"),
        ({"include_errors": False}, 'Here.\n\nTool calls:\n- add {"a": 1, "b": 2} → 3'),
        ({"include_text_response": False, "include_tool_calls": False, "include_errors": False}, ""),
    ],
)
async def test_result_shaping(app_factory: Any, drive: Any, flags: dict[str, bool], expected: str) -> None:
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder(
        {"text": "Here.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "explode"}]}
    )
    app, client, tid = await start(app_factory, catalog(main, sub, {"name": "helper", **flags}))
    await say(drive, client, tid, "go")
    assert result_of(await listed(client, tid))["content"] == expected
    async with app.state.runtime.sessions() as session:
        stream = [(r.type, r.data) for r in await events.read(session, uuid.UUID(tid), 0)]
    started = [(d["tool"], d.get("depth", 0)) for t, d in stream if t == "tool_started"]
    assert started == [("helper", 0), ("add", 1), ("explode", 1)]  # deeper events are hidden at depth=0
    deeper = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1]
    assert [(m["role"], m["name"], m["content"], m["tool_status"]) for m in deeper[2:]] == [
        ("tool", "add", "3", "success"),
        ("tool", "explode", "Tool `explode` failed: RuntimeError: kaboom", "error"),
    ]
    assert deeper[2]["tool_call_id"] == deeper[1]["tool_calls"][0]["id"]
    assert len(sub.requests) == 1  # one step: the results are not sent back to the subprompt's model


@pytest.mark.parametrize("include_chat", [False, True])
async def test_include_chat_decides_what_the_subprompt_sees(app_factory: Any, drive: Any, include_chat: bool) -> None:
    main = Recorder("Hello Ann.", {"text": "Let me polish.", **call("helper", message="a greeting")}, "ok")
    sub = Recorder("Dear Ann,")
    _, client, tid = await start(app_factory, catalog(main, sub, include_chat=include_chat))
    await say(drive, client, tid, "My name is Ann.")
    await say(drive, client, tid, "Write me a greeting.")
    chat = [
        ("user", "My name is Ann."),
        ("assistant", "Hello Ann."),
        ("user", "Write me a greeting."),
        ("assistant", "Let me polish."),  # the calling message, without its unanswered call
    ]
    assert sub.seen(0) == [("system", "You polish."), *(chat if include_chat else []), ("user", "a greeting")]


@pytest.mark.parametrize("past_tools", [False, True])
async def test_past_tools_only_with_include_past_tools(app_factory: Any, drive: Any, past_tools: bool) -> None:
    main = Recorder(call("add", a=2, b=2), "4.", call("helper", message="x"), "ok")
    sub = Recorder("polished")
    _, client, tid = await start(app_factory, catalog(main, sub, include_chat=True, include_past_tools=past_tools))
    await say(drive, client, tid, "2+2?")
    await say(drive, client, tid, "polish")
    tools = [("assistant", None), ("tool", "4")] if past_tools else []
    chat = [("user", "2+2?"), *tools, ("assistant", "4."), ("user", "polish")]
    assert sub.seen(0) == [("system", "You polish."), *chat, ("user", "x")]


async def test_first_message_and_attachments_from_the_arguments(app_factory: Any, drive: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "files": {"type": "array", "items": {"type": "string"}}},
        "required": ["text"],
    }
    entry = {"name": "helper", "init_user_message_property": "text", "init_attachments_property": "files"}
    main = Recorder(
        call("helper", text="Summarise this.", files=["/attachments/note.txt"]),
        call("helper", text="again", files=["/attachments/missing.txt"]),
        call("helper", text=5),
        "ok",
    )
    sub = Recorder("A note.")
    _, client, tid = await start(app_factory, catalog(main, sub, entry, required_schema=schema))
    put = await client.put(
        f"/threads/{tid}/fs/attachments/note.txt", content=b"hello", headers={"content-type": "text/plain"}
    )
    assert put.status_code == 201
    await say(drive, client, tid, "summarise my note")
    assert sub.seen(0)[-1] == (
        "user",
        "Summarise this.\n\nAttached files:\n- /attachments/note.txt (text/plain, 5 bytes)",
    )
    first = next(m for m in await listed(client, tid, depth=1) if m["depth"] == 1)
    assert first["attachments"] == [
        {"path": "/attachments/note.txt", "name": "note.txt", "mime_type": "text/plain", "size": 5}
    ]
    errors = [m["content"] for m in await listed(client, tid) if m["role"] == "tool"][1:]
    assert errors == [
        "Provided attachment path(s) not found in this thread: /attachments/missing.txt. Use an exact "
        "/attachments/... path that exists in this thread, then try again.",
        "Invalid arguments for tool `helper`: `text` must be of type string",
    ]
    assert len(sub.requests) == 1


async def test_attachments_is_the_default_attachments_argument(app_factory: Any, drive: Any) -> None:
    """A subprompt without `required_schema` takes `{message, attachments?}` (§7.2): the files reach its first
    `user` message, as the model of the subprompt sees it."""
    main = Recorder(
        call("helper", message="Summarise this.", attachments=["/attachments/note.txt"]),
        call("helper", message="again", attachments=["/attachments/missing.txt"]),
        call("helper", message="wrong", attachments=[1]),
        "ok",
    )
    sub = Recorder("A note.")
    _, client, tid = await start(app_factory, catalog(main, sub))
    put = await client.put(
        f"/threads/{tid}/fs/attachments/note.txt", content=b"hello", headers={"content-type": "text/plain"}
    )
    assert put.status_code == 201
    await say(drive, client, tid, "summarise my note")
    assert sub.seen(0)[-1] == (
        "user",
        "Summarise this.\n\nAttached files:\n- /attachments/note.txt (text/plain, 5 bytes)",
    )
    first = next(m for m in await listed(client, tid, depth=1) if m["depth"] == 1)
    assert first["attachments"] == [
        {"path": "/attachments/note.txt", "name": "note.txt", "mime_type": "text/plain", "size": 5}
    ]
    results = [(m["tool_status"], m["content"]) for m in await listed(client, tid) if m["role"] == "tool"]
    assert results == [
        ("success", "A note."),
        (
            "error",
            "Provided attachment path(s) not found in this thread: /attachments/missing.txt. Use an exact "
            "/attachments/... path that exists in this thread, then try again.",
        ),
        ("error", "Invalid arguments for tool `helper`: `attachments` must be paths"),
    ]
    assert len(sub.requests) == 1


async def test_without_the_named_property_the_arguments_are_the_message(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("search", query="cats", limit=2), call("search", limit=2), "ok")
    sub = Recorder("found")
    _, client, tid = await start(app_factory, catalog(main, sub))
    await say(drive, client, tid, "search cats")
    assert sub.seen(0) == [("system", "You search."), ("user", '{"query": "cats", "limit": 2}')]
    refused = [m for m in await listed(client, tid) if m["role"] == "tool"][1]
    assert refused["tool_status"] == "error"
    assert refused["content"] == "Invalid arguments for tool `search`: `query`: Field required"


async def test_subprompts_nest(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("helper", message="outer"), "ok")
    sub = Recorder(call("search", query="inner"), "inner result")
    _, client, tid = await start(app_factory, catalog(main, sub, tools=["search"]))
    await say(drive, client, tid, "go")
    rows = await listed(client, tid, depth=2)
    outer = next(m for m in rows if m["depth"] == 1 and m["role"] == "assistant")
    inner = [m for m in rows if m["depth"] == 2]
    assert [(m["role"], m["content"]) for m in inner] == [("user", '{"query": "inner"}'), ("assistant", "inner result")]
    assert all(m["parent_id"] == outer["id"] for m in inner)
    assert result_of(rows)["content"] == 'Tool calls:\n- search {"query": "inner"} → inner result'


async def test_an_llm_error_is_an_error_result_and_the_caller_goes_on(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("helper", message="go"), "It failed, sorry.")
    sub = Recorder({"error": "model refused", "status": 400})
    _, client, tid = await start(app_factory, catalog(main, sub))
    await say(drive, client, tid, "go")
    top = await listed(client, tid)
    assert result_of(top)["tool_status"] == "error"
    assert result_of(top)["content"] == "Subprompt `helper` failed: model refused"
    assert top[-1]["content"] == "It failed, sorry."
    failed = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "assistant"]
    assert [(m["status"], m["metadata"]["error"]) for m in failed] == [
        ("failed", {"code": "llm_error", "message": "model refused"})
    ]
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["status"] == "running"


async def test_invoke_tool_runs_a_subprompt_without_a_tool_message_for_it(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("invoker"), "ok")
    sub = Recorder("polished by invoke")
    _, client, tid = await start(app_factory, catalog(main, sub))
    await say(drive, client, tid, "go")
    top = await listed(client, tid)
    assert result_of(top, "invoker")["content"] == "success: polished by invoke"
    deeper = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1]
    assert [(m["role"], m["content"]) for m in deeper] == [
        ("user", "from a tool"),
        ("assistant", "polished by invoke"),
    ]
    assert deeper[0]["parent_id"] == top[1]["id"]


async def test_a_rerun_after_a_crash_replaces_the_interrupted_run(app_factory: Any, drive: Any) -> None:
    """A crash between the subprompt's messages and the caller's tool result: the resumed step runs the call
    again, and the messages the interrupted execution's run stored go first."""
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder("first", "second")
    app, client, tid = await start(app_factory, catalog(main, sub))
    await say(drive, client, tid, "go")
    call_id = (await listed(client, tid))[1]["tool_calls"][0]["id"]
    async with app.state.runtime.sessions() as session, session.begin():  # what a worker killed there leaves behind
        message = tables.Message
        later = select(message).where((message.tool_call_id == call_id) | (message.content == "ok"))
        for row in (await session.execute(later)).scalars():
            await session.delete(row)
        thread = await session.get(tables.Thread, uuid.UUID(tid))
        assert thread is not None
        thread.status, thread.side, thread.turn_steps = "running", "a", 1
        # the killed worker's kept history died with it; this worker's is told of removed rows by the counter
        # every removal bumps (`messages.remove`)
        thread.messages_removed += 1
        thread.runnable_since = func.now()

    async def rerun() -> list[dict[str, Any]] | None:
        rows = await listed(client, tid, depth=1)
        done = any(m["content"] == "second" for m in rows) and rows[-1]["content"] == "done"
        return rows if done else None

    await drive(app)
    rows = await rerun()
    assert rows is not None
    deeper = [m for m in rows if m["depth"] == 1]
    assert [(m["role"], m["content"]) for m in deeper] == [("user", "go"), ("assistant", "second")]
    assert [m["content"] for m in rows if m["role"] == "tool"] == ["second"]
    async with app.state.runtime.sessions() as session:
        thread = await session.get(tables.Thread, uuid.UUID(tid))
        assert thread is not None
        # three steps before the crash (call, the subprompt's, answer), then the answer again: the rerun of the
        # subprompt's step counted once already
        assert thread.session_steps == 4


async def _ended_session(
    app_factory: Any, drive: Any, main: Recorder, sub: Recorder, max_session_steps: int
) -> tuple[httpx.AsyncClient, str, dict[str, Any]]:
    """Post "go" to a thread of `catalog(main, sub)` with the step cap given and run it; the thread, its session
    ended."""
    app: FastAPI = await app_factory(catalog(main, sub), max_session_steps=max_session_steps)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    await drive(app)
    thread: dict[str, Any] = (await client.get(f"/threads/{tid}")).json()
    assert thread["status"] == "idle" and thread["session"]["status"] != "running", thread
    return client, tid, thread


async def test_subprompt_steps_count_toward_the_session_step_cap(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder("polished")
    client, tid, thread = await _ended_session(app_factory, drive, main, sub, 2)
    # the caller's step and the subprompt's step are the cap's two: the caller never gets a second one
    assert (thread["session"]["status"], thread["session"]["reason"]) == ("failure", "max_total_steps")
    assert len(main.requests) == 1 and len(sub.requests) == 1
    assert result_of(await listed(client, tid))["content"] == "polished"


async def test_a_subprompt_over_the_step_cap_is_not_run(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder("polished")
    client, tid, thread = await _ended_session(app_factory, drive, main, sub, 1)
    assert thread["session"]["reason"] == "max_total_steps"
    assert sub.requests == []
    tool = result_of(await listed(client, tid))
    assert (tool["content"], tool["tool_status"]) == (
        "Subprompt `helper` not run: the session reached its cap of 1 steps",
        "error",
    )


async def test_subprompt_steps_run_the_message_hooks_of_their_prompt(app_factory: Any, drive: Any) -> None:
    seen: list[tuple[str, str, int]] = []

    @define_hook("before_create_message")
    async def tag(state: ThreadState, message: dict[str, Any]) -> dict[str, Any]:
        message["metadata"] = {"created_as": message["role"]}  # replaced whole: the engine's own tags come back
        return message

    @define_hook("after_create_message")
    async def created(state: ThreadState, message: StateMessage) -> None:
        seen.append(("created", message.role, message.depth))

    @define_hook("before_update_message")
    async def shout(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        updates["content"] = (updates["content"] or "").upper()
        return updates

    @define_hook("after_update_message")
    async def updated(state: ThreadState, message: StateMessage) -> None:
        seen.append(("updated", message.content or "", message.depth))

    hooks = [tag, created, shout, updated]
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder({"text": "Here.", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]})
    cat = catalog(main, sub, hooks=[h.name for h in hooks])  # the subprompt's own hooks; the caller has none
    _, client, tid = await start(app_factory, dataclasses.replace(cat, hooks={h.name: h for h in hooks}))
    await say(drive, client, tid, "go")
    deeper = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1]
    assert [(m["role"], m["content"], m["metadata"].get("created_as")) for m in deeper] == [
        ("user", "go", "user"),
        ("assistant", "HERE.", "assistant"),
        ("tool", "3", "tool"),
    ]
    assert all(m["metadata"]["subprompt_call"] for m in deeper)  # the engine's own tags are kept
    assert seen == [
        ("created", "user", 1),
        ("created", "assistant", 1),
        ("updated", "HERE.", 1),
        ("created", "tool", 1),
    ]
    assert all(m["metadata"] == {} for m in await listed(client, tid))  # depth 0: the caller's prompt has none
    assert result_of(await listed(client, tid))["content"] == 'HERE.\n\nTool calls:\n- add {"a": 1, "b": 2} → 3'


async def test_subprompt_tool_calls_run_the_tool_hooks(app_factory: Any, drive: Any) -> None:
    @define_hook("after_tool_call_failure")
    async def recover(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        return ToolResult(status="success", result=f"recovered {tool_call['function']['name']}")

    @define_hook("before_store_tool_result")
    async def stamp(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        return ToolResult(status=result.status, result=f"{result.result} +stored")

    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "explode"}]})
    cat = catalog(main, sub, hooks=["recover", "stamp"])
    _, client, tid = await start(app_factory, dataclasses.replace(cat, hooks={"recover": recover, "stamp": stamp}))
    await say(drive, client, tid, "go")
    deeper = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "tool"]
    assert [(m["content"], m["tool_status"]) for m in deeper] == [
        ("3 +stored", "success"),
        ("recovered explode +stored", "success"),
    ]
    assert result_of(await listed(client, tid))["content"] == (
        'Tool calls:\n- add {"a": 1, "b": 2} → 3 +stored\n- explode {} → recovered explode +stored'
    )
    logged = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]
    by_tool = {row["tool"]: row for row in logged}  # every tool call has its row, a subprompt's too
    assert sorted(by_tool) == ["add", "explode", "helper"]
    # the result as stored, as a callable's row of the step loop says it (`tool_phase`), with its message
    assert (by_tool["add"]["status"], by_tool["explode"]["status"]) == ("success", "success")
    assert (by_tool["explode"]["error"], by_tool["explode"]["message_id"]) == (None, deeper[1]["id"])
    assert by_tool["add"]["message_id"] == deeper[0]["id"] and by_tool["add"]["request"]["arguments"] == (
        '{"a": 1, "b": 2}'
    )


@define_tool(description="Draws a picture.")
async def draw(state: ThreadState) -> ToolResult:
    data = base64.b64encode(b"a picture").decode()
    return ToolResult(
        status="success",
        result="drawn",
        attachments=[ToolAttachment(name="pic.txt", mime_type="text/plain", data=data)],
    )


async def test_files_a_subprompt_tool_returns_are_kept(app_factory: Any, drive: Any) -> None:
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder({"tool_calls": [{"name": "draw"}]})
    cat = catalog(main, sub, tools=["draw"])
    _, client, tid = await start(app_factory, dataclasses.replace(cat, tools={**cat.tools, "draw": draw}))
    await say(drive, client, tid, "go")
    [tool] = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "tool"]
    [ref] = tool["attachments"]
    assert ref["path"].startswith("/attachments/pic-") and (ref["name"], ref["size"]) == ("pic.txt", 9)
    assert (await client.get(f"/threads/{tid}/fs{ref['path']}")).content == b"a picture"
    assert tool["content"] == "drawn"
    # the caller's model learns the file's path from the subprompt's result
    assert result_of(await listed(client, tid))["content"] == (
        f"Tool calls:\n- draw {{}} → drawn\n\nAttached files:\n- {ref['path']} (text/plain, 9 bytes)"
    )


class Delegating(test_subagents.Brain):
    """The subagent tests' brain, plus a `delegator` subprompt that hands the work to the `qa` subagent."""

    async def __call__(self, request: LLMRequest) -> Any:
        if (request.messages[0].content or "").startswith("delegator."):
            return {"tool_calls": [{"name": "qa", "arguments": {"message": "check the report"}}]}
        return await super().__call__(request)


async def test_subagent_tools_run_non_blocking_inside_a_subprompt_step(app_factory: Any, drive: Any) -> None:
    def boss(request: LLMRequest) -> Any:
        last = test_subagents.last_of(request)
        if last.role == "user" and last.content == "go":
            return {"tool_calls": [{"name": "delegator", "arguments": {"message": "hand it on"}}]}
        return f"boss saw: {last.content}"

    cat = test_subagents.catalog(Delegating(boss), {"name": "qa"})  # `qa` blocks where the step loop calls it
    delegator = define_prompt(
        name="delegator", model="m", prompt="delegator. Hand work on.", tool_description="Delegates.", tools=["qa"]
    )
    boss_prompt = define_prompt(
        name="boss", model="m", prompt="boss. Delegate.", include_chat=True, tools=["delegator"]
    )
    cat = dataclasses.replace(cat, prompts={**cat.prompts, "boss": boss_prompt, "delegator": delegator})
    app: FastAPI = await app_factory(cat)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "boss"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    await drive(app)  # the boss, its child, then the boss again with the child's result
    rows = await stored(client, tid)
    assert any((r["content"] or "").startswith("boss saw: Subagent") for r in rows), rows
    [child] = await test_subagents.registry(client, tid)
    cid = child["reference"]
    assert (child["blocking"], child["status"]) == (False, "terminated")
    started = f"The subagent was initiated successfully. Reference: {cid}"
    [answer] = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "tool"]
    assert (answer["name"], answer["content"], answer["subagent_id"]) == ("qa", started, cid)
    # the caller's step went on at once; the child's result came later as a silent message, as a non-blocking one's
    assert rows[2]["content"] == f'Tool calls:\n- qa {{"message": "check the report"}} → {started}'
    assert rows[3]["content"] == f"boss saw: {rows[2]['content']}"
    report = next(r for r in rows if (r["metadata"] or {}).get("subagent_id") == cid)
    assert report["silent"] and report["content"].startswith(
        f"Subagent (reference: {cid}) has returned the following result:\n\nlooks good"
    )


def delegating(brain: test_subagents.Brain, **delegator: Any) -> Catalog:
    """The subagent tests' catalog where the boss calls the `delegator` subprompt, which may call `qa`."""
    cat = test_subagents.catalog(brain, {"name": "qa"})  # `qa` blocks where the step loop calls it
    fields = {"tool_description": "Delegates.", "tools": ["qa"], **delegator}
    prompt = define_prompt(name="delegator", model="m", prompt="delegator. Hand work on.", **fields)
    boss_prompt = define_prompt(
        name="boss", model="m", prompt="boss. Delegate.", include_chat=True, tools=["delegator"]
    )
    return dataclasses.replace(cat, prompts={**cat.prompts, "boss": boss_prompt, "delegator": prompt})


def handing_on(request: LLMRequest) -> Any:
    """The boss: hands "go" to the delegator, then says what it saw."""
    last = test_subagents.last_of(request)
    if last.role == "user" and last.content == "go":
        return {"tool_calls": [{"name": "delegator", "arguments": {"message": "hand it on"}}]}
    return f"boss saw: {last.content}"


async def test_a_subprompt_subagent_calls_log_row_holds_the_result_as_stored(app_factory: Any, drive: Any) -> None:
    cat = delegating(Delegating(handing_on), hooks=[test_subagents.refuse.name])
    app: FastAPI = await app_factory(
        dataclasses.replace(cat, hooks={test_subagents.refuse.name: test_subagents.refuse})
    )
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "boss"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    await drive(app)
    [answer] = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "tool"]
    assert answer["tool_status"] == "error" and answer["content"].startswith("refused: The subagent was initiated")
    logged = {r["tool"]: r for r in await test_subagents.tool_logs(client, tid)}
    assert (logged["qa"]["status"], logged["qa"]["error"]) == ("error", answer["content"])
    assert (
        logged["qa"]["message_id"] == answer["id"] and logged["qa"]["request"]["subagent_id"] == answer["subagent_id"]
    )


@pytest.mark.parametrize("child_first", [True, False])
async def test_a_rerun_ends_the_children_the_interrupted_run_started(
    app_factory: Any, llm_client: httpx.AsyncClient, child_first: bool
) -> None:
    """A crash after a subprompt's non-blocking child was created: the rerun forgets the run's messages, and the
    child with them: it is terminated, and nothing it said (its report, queued or delivered already) is left in
    the thread, as if the interrupted run had never been. The rerun's own child reports as usual."""
    crashes: list[str] = []

    @define_tool(description="Crashes the execution the first time.")
    async def crash(state: ThreadState) -> str:
        if not crashes:
            crashes.append("crashed")
            raise errors.Contention()  # the execution ends as if its worker died: the step is run again
        return "fine"

    class Crashing(test_subagents.Brain):
        async def __call__(self, request: LLMRequest) -> Any:
            if (request.messages[0].content or "").startswith("delegator."):
                return {"tool_calls": [{"name": "qa", "arguments": {"message": "check the report"}}, {"name": "crash"}]}
            return await super().__call__(request)

    cat = delegating(Crashing(handing_on), tools=["qa", "crash"])
    app: FastAPI = await app_factory(dataclasses.replace(cat, tools={**cat.tools, "crash": crash}))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "boss"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    async with harness.harness(app, llm_client) as engine:
        assert await engine.step() == uuid.UUID(tid) and crashes  # the interrupted run: its child is created
        [first] = await test_subagents.registry(client, tid)
        async with app.state.runtime.sessions() as session, session.begin():  # who is claimed first
            later = await session.get(tables.Thread, uuid.UUID(tid if child_first else first["reference"]))
            assert later is not None and later.runnable_since is not None
            later.runnable_since += timedelta(hours=1)
        ran = await engine.drain()
    assert ran[0] == (uuid.UUID(first["reference"]) if child_first else uuid.UUID(tid))
    first_id = first["reference"]
    assert (await client.get(f"/threads/{first_id}")).json()["status"] == "terminated"
    assert bool(await stored(client, first_id)) is child_first  # it ran (and reported) before the rerun, or never
    [_, second] = await test_subagents.registry(client, tid)
    rows = (await client.get(f"/threads/{tid}/messages", params={"depth": 1, "include_silent": True})).json()
    spoke = {(m["subagent_id"], m["depth"]) for m in rows["messages"] if m["subagent_id"]}
    assert spoke == {(second["reference"], 1), (second["reference"], 0)}  # its creation, and its report
    async with app.state.runtime.sessions() as session:
        assert await queue.pending(session, uuid.UUID(tid)) == []
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "idle"


def test_shape_of_a_plain_answer() -> None:
    assert subprompts.shape(ToolEntry(name="x"), "  text  ", []) == "text"


def _outcome(name: str, arguments: dict[str, Any] | None, status: str, text: str) -> types.Outcome:
    call: ToolCall = {"id": "c", "type": "function", "function": {"name": name, "arguments": '{"raw": 1}'}}
    result = (
        ToolResult(status="success", result=text) if status == "success" else ToolResult(status="error", error=text)
    )
    return types.Outcome(call, result, arguments)


SHAPED = [_outcome("add", {"a": 1}, "success", "2"), _outcome("explode", None, "error", "kaboom")]


def test_shape_lists_tool_calls_and_errors_after_the_answer() -> None:
    assert subprompts.shape(ToolEntry(name="x"), "answer\n", SHAPED) == (
        'answer\n\nTool calls:\n- add {"a": 1} → 2\n\nErrors:\n- explode {"raw": 1} → kaboom'
    )


def test_shape_leaves_out_what_the_entry_turns_off() -> None:
    entry = ToolEntry(name="x", include_text_response=False, include_errors=False)
    assert subprompts.shape(entry, "answer", SHAPED) == 'Tool calls:\n- add {"a": 1} → 2'
    assert subprompts.shape(ToolEntry(name="x", include_tool_calls=False), "  ", SHAPED) == (
        'Errors:\n- explode {"raw": 1} → kaboom'
    )


async def test_a_subprompt_step_is_offered_creation_only_below_max_instances(app_factory: Any, drive: Any) -> None:
    """A subprompt's step counts the thread's live children afresh, as the step loop does (0.14.1)."""
    entry = {"name": "qa", "resumable": {"receives_messages": "side_a", "max_instances": 1}}
    seen: list[set[str]] = []

    class Creating(test_subagents.Brain):
        async def __call__(self, request: LLMRequest) -> Any:
            if (request.messages[0].content or "").startswith("delegator."):
                seen.append({t.name for t in request.tools})
                arguments = {"agent": "qa", "message": "check the report", "attachments": []}
                return {"tool_calls": [{"name": "subagent_create", "arguments": arguments}]}
            return await super().__call__(request)

    def boss(request: LLMRequest) -> Any:
        last = test_subagents.last_of(request)
        if last.role == "user" and last.content in ("go", "again"):
            return {"tool_calls": [{"name": "delegator", "arguments": {"message": "hand it on"}}]}
        return f"boss saw: {last.content}"

    cat = test_subagents.catalog(Creating(boss), entry)
    delegator = define_prompt(
        name="delegator", model="m", prompt="delegator. Hand work on.", tool_description="Delegates.", tools=[entry]
    )
    boss_prompt = define_prompt(
        name="boss", model="m", prompt="boss. Delegate.", include_chat=True, tools=["delegator"]
    )
    cat = dataclasses.replace(cat, prompts={**cat.prompts, "boss": boss_prompt, "delegator": delegator})
    app: FastAPI = await app_factory(cat)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "boss"})).json()["id"]
    for text in ("go", "again"):
        await client.post(f"/threads/{tid}/messages", json={"content": text})
        await drive(app)
    assert seen == [{"subagent_create", "subagent_message"}, {"subagent_message"}]
    assert len(await test_subagents.registry(client, tid)) == 1
    answers = [m["content"] for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "tool"]
    assert answers[1].startswith('Subagent instance limit reached for "qa" (1).')  # the call made anyway


async def test_a_subprompt_that_allows_parallel_calls_runs_them_at_once(app_factory: Any, drive: Any) -> None:
    """The calls of a subprompt's answer run at once when its prompt sets `parallel_tool_calls` (three calls that
    can only finish by meeting), and are stored beside the answer in the order of the calls."""
    from tests import test_engine_tool_phase as phase

    phase.MEETING = phase.Meeting()
    meeting = {"tool_calls": [{"name": "meet", "arguments": {"party": 3, "wait": 3}} for _ in range(3)]}
    main = Recorder(call("helper", message="meet"), "Sent.")
    sub = Recorder(meeting, "all met")
    cat = catalog(main, sub, tools=["meet"], parallel_tool_calls=True)
    cat = dataclasses.replace(cat, tools={**cat.tools, "meet": phase.meet})
    _, client, tid = await start(app_factory, cat)
    await say(drive, client, tid, "go")
    deeper = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1]
    answer = next(m for m in deeper if m["role"] == "assistant")
    results = [m for m in deeper if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == [c["id"] for c in answer["tool_calls"]]
    assert [(m["tool_status"], m["content"]) for m in results] == [("success", "met 3")] * 3
    assert [kind for kind, _ in phase.MEETING.log[:3]] == ["start"] * 3


async def test_a_subprompt_step_runs_the_history_hooks_of_its_prompt(app_factory: Any, drive: Any) -> None:
    """The request of a subprompt's step is made as a thread step's is (`engine/pipeline.py`): its prompt's
    `filter_messages` and `prefilter_llm_history` hooks shape it (they were skipped on this path)."""

    @define_hook("filter_messages")
    async def shout(state: ThreadState, messages: list[StateMessage]) -> list[StateMessage]:
        for m in messages:
            m.content = (m.content or "").upper()
        return messages

    @define_hook("prefilter_llm_history")
    async def patch(state: ThreadState, messages: list[Any]) -> list[Any]:
        return [type(messages[0])("system", "patched"), *messages[1:]]

    hooks = [shout, patch]
    main = Recorder(call("helper", message="go"), "ok")
    sub = Recorder("Here.")
    cat = catalog(main, sub, hooks=[h.name for h in hooks], include_chat=True)  # the subprompt's own hooks
    _, client, tid = await start(app_factory, dataclasses.replace(cat, hooks={h.name: h for h in hooks}))
    await say(drive, client, tid, "polish this")
    assert sub.seen(0) == [("system", "patched"), ("user", "POLISH THIS"), ("user", "go")]
    assert main.seen(0) == [("system", "You coordinate."), ("user", "polish this")]  # the caller's prompt has none


async def test_a_subprompts_streaming_text_is_kept_as_a_steps_is_in_single_statements(
    app_factory: Any, drive: Any
) -> None:
    """A subprompt's answer streamed over several `FLUSH_SECONDS` keeps its text so far as a step's answer does:
    one UPDATE of its message outside any transaction each (`messages.PARTIAL`, conditioned on the lease), the text
    growing; the stored answer is the whole text."""
    main = Recorder(call("helper", message="spell"), "Sent.")
    cat = catalog(main, Recorder("abcdefgh"))
    slow = cat.models["s"].model_copy(update={"chunk_size": 1, "chunk_delay_ms": 70})
    cat = Catalog(
        root=cat.root, models={**cat.models, "s": slow}, prompts=cat.prompts, agents=cat.agents, tools=cat.tools
    )
    app, client, tid = await start(app_factory, cat)
    with test_engine_run.statements_sent(app.state.runtime.sessions) as seen:
        await say(drive, client, tid, "go")
    deeper = [m for m in await listed(client, tid, depth=1) if m["depth"] == 1 and m["role"] == "assistant"]
    assert [(m["content"], m["status"]) for m in deeper] == [("abcdefgh", "completed")]
    partials = [q for q in seen if q.query == messages.PARTIAL]
    assert len(partials) >= 2 and all(q.exception is None for q in partials)
    assert {(str(q.args[0]), str(q.args[1])) for q in partials} == {(tid, deeper[0]["id"])}
    fence = "FROM threads t WHERE t.id = $1 AND t.lease_token = $2"
    fenced = {q.args[1] for q in seen if fence in " ".join(q.query.split())}
    assert len(fenced) == 1 and {q.args[3] for q in partials} == fenced  # conditioned on the execution's own lease
    texts = [q.args[2] for q in partials]
    assert texts == sorted(texts) and all("abcdefgh".startswith(t) for t in texts)
