"""`ThreadState` as tools see it in the worker, and as code outside the thread's execution sees it (§12, §7.4)."""

from __future__ import annotations

import base64
import dataclasses
import gc
import json
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app import crypto, errors, events, tables
from app.catalog import Catalog
from app.engine.state import RunState, Shared
from app.engine.types import Env
from app.llm.base import LLMRequest
from app.spec import (
    AttachmentRef,
    StateMessage,
    ThreadState,
    ToolAttachment,
    ToolDefinition,
    define_agent,
    define_model,
    define_prompt,
    define_tool,
)
from tests.conftest import client_for
from tests.tools import add

# -- tools --------------------------------------------------------------------------------------------------


class TextArgs(BaseModel):
    text: str


class VarArgs(BaseModel):
    name: str
    value: str | None = None


class QueueArgs(BaseModel):
    name: str


@define_tool(description="Identity, definitions and names.")
async def probe(state: ThreadState) -> dict[str, Any]:
    model, prompt, agent = await state.load_model("m"), await state.load_prompt("p"), await state.load_agent("agent")
    assert model is not None and prompt is not None and agent is not None
    state.context["probed"] = True
    return {
        "ids": [state.thread_id, state.agent_id, state.user_id, state.created_at.isoformat(), state.terminated],
        "execution": dataclasses.asdict(state.execution) if state.execution else None,
        "context": state.context,
        "loaded": [model.provider, prompt.model, agent.side_a.prompt],
        "missing": [await state.load_model("x"), await state.load_prompt("x"), await state.load_agent("x")],
        "names": [state.get_model_names(), state.get_prompt_names(), state.get_agent_names(), state.get_tool_names()],
    }


@define_tool(description="Reads the history.")
async def history(state: ThreadState) -> dict[str, Any]:
    page = await state.get_messages()
    first = page.messages[0]
    newest = await state.get_messages(order="desc", limit=1)
    again = await state.get_message(first.id)
    return {
        "roles": [m.role for m in page.messages],
        "total": page.total,
        "has_more": page.has_more,
        "second_page": [m.role for m in (await state.get_messages(limit=1, offset=1)).messages],
        "newest": newest.messages[0].role,
        "more_after_newest": newest.has_more,
        "with_silent": (await state.get_messages(include_silent=True)).total,
        "again": again.content if again else None,
        "unknown": [await state.get_message(str(uuid.uuid4())), await state.get_message("not-an-id")],
    }


@define_tool(description="Reads the request logs.")
async def logs(state: ThreadState) -> dict[str, Any]:
    rows = await state.get_logs()
    newest = await state.get_logs(order="desc", limit=1)
    return {
        "rows": [[r.kind, r.model, r.provider, r.status, r.finish_reason] for r in rows],
        "newest_is_last": newest[0].id == rows[-1].id,
        "skipped": len(await state.get_logs(offset=1)),
    }


@define_tool(description="Injects a message.")
async def inject(state: ThreadState, args: TextArgs) -> str:
    await state.inject_message("system", "quiet note", silent=True, metadata={"kind": "note"})
    return (await state.inject_message("user", args.text, metadata={"via": "inject"})).id


@define_tool(description="Queues a message.")
async def enqueue(state: ThreadState, args: TextArgs) -> str:
    return await state.queue_message("user", args.text, metadata={"via": "queue"})


@define_tool(description="Edits the first message.")
async def edit(state: ThreadState, args: TextArgs) -> dict[str, Any]:
    first = (await state.get_messages(limit=1)).messages[0]
    updated = await state.update_message(first.id, content=args.text, metadata={"edited": True})
    kept = await state.update_message(first.id, metadata={"edited": 2})
    try:
        await state.update_message(str(uuid.uuid4()), content="x")
        missing = "updated"
    except errors.MessageNotFound:
        missing = "not found"
    return {"content": updated.content, "kept": [kept.content, kept.metadata], "missing": missing}


@define_tool(description="Deletes the first tool-call message.")
async def drop(state: ThreadState) -> list[bool]:
    page = await state.get_messages()
    target = next(m for m in page.messages if m.tool_calls)
    return [
        await state.delete_message(target.id),
        await state.delete_message(target.id),
        await state.delete_message("not-an-id"),
    ]


@define_tool(
    description="Sets a variable and reads it back.",
    variables=[{"name": "TOKEN", "type": "secret"}],
)
async def set_var(state: ThreadState, args: VarArgs) -> str:
    assert args.value is not None
    await state.set_env(args.name, args.value)
    return await state.env(args.name)


@define_tool(description="Reads a variable.")
async def read_var(state: ThreadState, args: VarArgs) -> str:
    return await state.env(args.name)


@define_tool(description="Invokes other tools.")
async def invoker(state: ThreadState) -> list[list[str | None]]:
    results = [
        await state.invoke_tool("add", {"a": 1, "b": 2}),
        await state.invoke_tool("add", {"a": "x"}),
        await state.invoke_tool("explode"),
        await state.invoke_tool("nope"),
        await state.invoke_tool("p"),
        await state.invoke_tool("agent"),
    ]
    return [[r.status, r.text] for r in results]


@define_tool(description="Always fails.")
async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


@define_tool(description="Queues a tool call.")
async def queuer(state: ThreadState, args: QueueArgs) -> str:
    try:
        return await state.queue_tool(args.name, {"a": 2, "b": 2})
    except errors.Invalid as exc:
        return f"refused: {exc}"


@define_tool(description="Emits an event.")
async def shout(state: ThreadState) -> str:
    await state.emit("shout", {"loud": True})
    return "ok"


@define_tool(description="Counts its calls in `state.context`.")
async def count(state: ThreadState) -> str:
    state.context["n"] = state.context.get("n", 0) + 1
    return str(state.context["n"])


@define_tool(description="Queues a message with files.")
async def enqueue_files(state: ThreadState) -> str:
    await state.write_file("/notes/a.txt", "kept")
    new = ToolAttachment(name="new report.txt", mime_type="text/plain", data=base64.b64encode(b"fresh").decode())
    try:
        await state.queue_message("user", "x", attachments=["/notes/missing.txt"])
        missing = "queued"
    except errors.FileNotFound as exc:
        missing = exc.message
    try:
        await state.queue_message("user", "x", attachments=[{"name": "bad"}])  # type: ignore[list-item]
        bad = "queued"
    except errors.Invalid as exc:
        bad = exc.message
    refs: list[str | AttachmentRef] = ["/notes/a.txt", AttachmentRef(path="/notes/a.txt", name="renamed.txt")]
    queued = await state.queue_message("user", "see the files", attachments=[new, *refs])
    return json.dumps([queued, missing, bad])


@define_tool(description="Reads every field of every message.")
async def fields(state: ThreadState) -> str:
    page = await state.get_messages(include_silent=True)
    one = await state.get_message(page.messages[0].id)
    assert one is not None and one == page.messages[0]
    return json.dumps([m.model_dump(mode="json") for m in page.messages])


TOOLS = [
    add,
    probe,
    history,
    logs,
    inject,
    enqueue,
    edit,
    drop,
    set_var,
    read_var,
    invoker,
    explode,
    queuer,
    shout,
    count,
    enqueue_files,
    fields,
]

# -- harness ------------------------------------------------------------------------------------------------


class Recorder:
    """A `test` model's `respond`: answers with `replies` in order (then `done`) and records every request."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.seen: list[list[tuple[Any, ...]]] = []

    def __call__(self, request: LLMRequest) -> Any:
        seen: list[tuple[Any, ...]] = []
        for m in request.messages:
            if m.tool_calls:
                seen.append((m.role, m.content, [c["function"]["name"] for c in m.tool_calls]))
            elif m.role == "tool":
                seen.append((m.role, m.content, m.name))
            else:
                seen.append((m.role, m.content))
        self.seen.append(seen)
        return self.replies[len(self.seen) - 1] if len(self.seen) <= len(self.replies) else "done"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def catalog(respond: Callable[[LLMRequest], Any], prompt: Any = "sys") -> Catalog:
    tools = {t.name: t for t in TOOLS}
    model = define_model(name="m", provider="test", respond=respond)
    p = define_prompt(
        name="p",
        tool_description="t",
        model="m",
        prompt=prompt,
        include_chat=True,
        include_past_tools=True,
        tools=[t for t in tools if t != "explode"],  # a catalog tool the prompt does not offer
    )
    agent = define_agent(name="agent", side_a={"prompt": "p"}, env={"GREETING": "hi"})
    return Catalog(root=Path("."), models={"m": model}, prompts={"p": p}, agents={"agent": agent}, tools=tools)


def offering(cat: Catalog, *more: ToolDefinition) -> Catalog:
    """`cat` with more tools, which its prompt offers too."""
    cat.prompts["p"].tools.extend(t.name for t in more)
    return dataclasses.replace(cat, tools={**cat.tools, **{t.name: t for t in more}})


async def start(app_factory: Any, cat: Catalog, **body: Any) -> tuple[FastAPI, httpx.AsyncClient, str]:
    """An app without a worker (`settle` runs what is runnable) and a new thread of `agent`."""
    app: FastAPI = await app_factory(cat)
    client = client_for(app)
    created = await client.post("/threads", json={"agent": "agent", **body})
    assert created.status_code == 201, created.text
    return app, client, created.json()["id"]


async def say(drive: Any, client: httpx.AsyncClient, tid: str, content: str) -> None:
    assert (await client.post(f"/threads/{tid}/messages", json={"content": content})).status_code == 202
    await settle(drive, client, tid)


async def settle(drive: Any, client: httpx.AsyncClient, tid: str) -> None:
    """Run what is runnable to its end (`drive`); the thread is then idle, in a session."""
    await drive(client._transport.app)  # type: ignore[attr-defined]
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["status"] == "idle" and thread["session"]["number"] >= 1, thread


async def stored(client: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    body = (await client.get(f"/threads/{tid}/messages", params={"include_silent": True})).json()
    return list(body["messages"])


def results(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Tool results by tool name (the last one wins)."""
    return {m["name"]: m["content"] for m in rows if m["role"] == "tool"}


async def stored_events(app: FastAPI, tid: str) -> list[tuple[str, dict[str, Any]]]:
    async with app.state.runtime.sessions() as session:
        rows = await events.read(session, uuid.UUID(tid), 0)
    return [(r.type, r.data) for r in rows]


async def outside(app: FastAPI, tid: str) -> RunState:
    """The state code outside the thread's execution (an endpoint) gets: no lease, the thread row locked."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[tuple[AsyncSession, tables.Thread]]:
        async with app.state.runtime.sessions() as session, session.begin():
            query = select(tables.Thread).where(tables.Thread.id == uuid.UUID(tid)).with_for_update(key_share=True)
            yield session, (await session.execute(query)).scalar_one()

    async with transaction() as (_, thread):
        pass
    runtime = app.state.runtime
    return Shared(thread, Env({}, {}, {}), transaction, catalog=runtime.catalog, fernet=runtime.fernet).state()


# -- identity, definitions, reads ---------------------------------------------------------------------------


async def test_identity_definitions_and_names(app_factory: Any, drive: Any) -> None:
    _, client, tid = await start(app_factory, catalog(Recorder(call("probe"))))
    await say(drive, client, tid, "who?")
    thread = (await client.get(f"/threads/{tid}")).json()
    rows = await stored(client, tid)
    got = json.loads(results(rows)["probe"])
    assert got["ids"][:3] == [tid, "agent", thread["user_id"]]
    assert got["ids"][3].startswith(thread["created_at"][:19]) and got["ids"][4] is None
    assert got["execution"] == {
        "side": "a",
        "step": 1,
        "session": 1,
        "attempt": 1,
        "tool_call_id": rows[1]["tool_calls"][0]["id"],
        "tool_options": {},
    }
    assert got["context"] == {"probed": True}
    assert got["loaded"] == ["test", "m", "p"]
    assert got["missing"] == [None, None, None]
    assert got["names"][:3] == [["m"], ["p"], ["agent"]]
    assert got["names"][3] == sorted(t.name for t in TOOLS)


async def test_a_state_is_freed_without_the_cycle_collector(app_factory: Any) -> None:
    """A state and the helpers it delegates to (`Messages` and its hooks among them) refer to each other in one
    direction only: dropped, the state is freed by reference counting. (The message helper held the state's bound
    method, a cycle per state, four states a tool run: garbage that piled up between the collector's full passes.)"""
    app, _, tid = await start(app_factory, catalog(Recorder("hello")))
    state = await outside(app, tid)
    gc.disable()
    try:
        made = weakref.ref(state)
        del state
        assert made() is None
    finally:
        gc.enable()


async def test_reads_messages_and_logs(app_factory: Any, drive: Any) -> None:
    recorder = Recorder("hello", {"tool_calls": [{"name": "history"}, {"name": "logs"}]})
    app, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "one")
    async with app.state.runtime.sessions() as session, session.begin():  # a silent message the default read leaves out
        await session.execute(
            text("INSERT INTO messages (id, thread_id, role, content, silent) VALUES (:id, :t, 'system', 's', true)"),
            {"id": uuid.uuid4(), "t": uuid.UUID(tid)},
        )
    await say(drive, client, tid, "two")
    got = results(await stored(client, tid))
    read = json.loads(got["history"])
    # the step's own tool results are not stored yet while its tools run
    assert read["roles"] == ["user", "assistant", "user", "assistant"]
    assert read["total"] == 4 and read["has_more"] is False
    assert read["second_page"] == ["assistant"]
    assert read["newest"] == "assistant" and read["more_after_newest"] is True
    assert read["with_silent"] == 5
    assert read["again"] == "one" and read["unknown"] == [None, None]
    logged = json.loads(got["logs"])
    assert logged["rows"] == [
        ["llm", "m", "test", "success", "stop"],
        ["llm", "m", "test", "success", "tool_calls"],
        ["tool", None, None, "success", None],  # the step's `history` call, which ran before this one
    ]
    assert logged["newest_is_last"] is True and logged["skipped"] == 2


# -- message writes ------------------------------------------------------------------------------------------


async def test_inject_message_writes_history_now(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(call("inject", text="injected"), "ok")
    app, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "go")
    rows = await stored(client, tid)
    assert [(m["role"], m["content"], m["silent"]) for m in rows] == [
        ("user", "go", False),
        ("assistant", None, False),
        ("system", "quiet note", True),
        ("user", "injected", False),
        ("tool", rows[3]["id"], False),
        ("assistant", "ok", False),
    ]
    assert rows[2]["metadata"] == {"kind": "note"} and rows[3]["metadata"] == {"via": "inject"}
    # the tool result follows its call even though the injected messages were stored in between
    assert recorder.seen[1][1:] == [
        ("user", "go"),
        ("assistant", None, ["inject"]),
        ("tool", rows[3]["id"], "inject"),
        ("system", "quiet note"),
        ("user", "injected"),
    ]
    announced = [d["data"]["content"] for t, d in await stored_events(app, tid) if t == "message_data"]
    assert "injected" in announced and "quiet note" in announced


async def test_queue_message_is_delivered_before_the_next_llm_call(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(call("enqueue", text="queued"), "ok")
    app, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "go")
    rows = await stored(client, tid)
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "go"),
        ("assistant", None),
        ("tool", rows[3]["id"]),
        ("user", "queued"),
        ("assistant", "ok"),
    ]
    assert rows[3]["metadata"] == {"via": "queue"}
    assert recorder.seen[1][-1] == ("user", "queued")
    # delivered mid-turn: it joins the history, the turn goes on
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["turns"] == 1
    assert [d for t, d in await stored_events(app, tid) if t == "turn_ended"] == [
        {"side": "a", "reason": "stop_on_response"}
    ]


async def test_queue_message_takes_new_files_and_files_of_the_thread(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(call("enqueue_files"), "ok")
    _, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "go")
    rows = await stored(client, tid)
    queued_id, missing, bad = json.loads(results(rows)["enqueue_files"])
    assert missing == "Attachment not found: /notes/missing.txt"
    assert bad.startswith("each attachment is a path, a reference with `path`, or a new file")
    [delivered] = [m for m in rows if m["content"] == "see the files"]  # the refused ones queued nothing
    assert delivered["id"] == queued_id and delivered["role"] == "user"
    new, kept, renamed = delivered["attachments"]
    assert new["path"].startswith("/attachments/new-report-") and new["path"].endswith(".txt")
    assert (new["name"], new["mime_type"], new["size"]) == ("new report.txt", "text/plain", 5)
    assert (await client.get(f"/threads/{tid}/fs{new['path']}")).content == b"fresh"
    assert (kept["path"], kept["name"], kept["size"]) == ("/notes/a.txt", "a.txt", 4)
    assert (renamed["path"], renamed["name"]) == ("/notes/a.txt", "renamed.txt")


async def test_state_messages_carry_the_spec_message_fields(app_factory: Any, drive: Any) -> None:
    recorder = Recorder({"text": "thinking done", "reasoning": "let me think"}, call("fields"), "ok")
    _, client, tid = await start(app_factory, catalog(recorder))
    note = {"name": "n.txt", "mime_type": "text/plain", "data": base64.b64encode(b"hi").decode()}
    posted = await client.post(f"/threads/{tid}/messages", json={"content": "one", "attachments": [note]})
    assert posted.status_code == 202
    await settle(drive, client, tid)
    await say(drive, client, tid, "two")
    rows = await stored(client, tid)
    seen = json.loads(results(rows)["fields"])
    by_id = {m["id"]: m for m in rows}
    for message in seen:  # every field of the spec's `Message` the API has, with the same values
        api = by_id[message["id"]]
        message["attachments"] = [{k: v for k, v in a.items() if v is not None} for a in message["attachments"]]
        for key in ("parent_id", "attachments", "reasoning_content", "subagent_id", "subagent_name", "depth"):
            assert message[key] == api[key], key
    assert seen[0]["attachments"][0]["name"] == "n.txt" and seen[0]["attachments"][0]["size"] == 2
    assert seen[1]["reasoning_content"] == "let me think"
    assert {"parent_id", "subagent_status", "subagent_spawn_group_id"} <= set(StateMessage.model_fields)


async def test_queue_message_from_outside_starts_a_run(app_factory: Any, drive: Any) -> None:
    recorder = Recorder("answer")
    app, client, tid = await start(app_factory, catalog(recorder))
    state = await outside(app, tid)
    message_id = await state.queue_message("user", "from outside", silent=False, metadata={"k": 1})
    await settle(drive, client, tid)
    rows = await stored(client, tid)
    assert (rows[0]["id"], rows[0]["role"], rows[0]["content"]) == (message_id, "user", "from outside")
    assert rows[-1]["content"] == "answer"
    assert ("thread_status", {"status": "queued"}) in await stored_events(app, tid)
    with pytest.raises(errors.Invalid):
        await state.queue_message("system", "no")  # type: ignore[arg-type]
    with pytest.raises(errors.Invalid):
        await state.queue_message("user", "nul \x00")
    async with app.state.runtime.sessions() as session, session.begin():
        await session.execute(text("UPDATE threads SET terminated_at = now() WHERE id = :id"), {"id": uuid.UUID(tid)})
    with pytest.raises(errors.ThreadTerminated):
        await state.queue_message("user", "too late")
    terminated = (await outside(app, tid)).terminated
    async with app.state.runtime.sessions() as session:
        row = await session.get(tables.Thread, uuid.UUID(tid))
    assert row is not None and row.terminated_at is not None
    assert terminated == row.terminated_at  # when it was terminated (the spec's timestamp), not a flag


async def test_writes_outside_the_execution_are_refused(app_factory: Any, drive: Any) -> None:
    app, client, tid = await start(app_factory, catalog(Recorder("hi")))
    await say(drive, client, tid, "one")
    state = await outside(app, tid)
    first = (await state.get_messages()).messages[0]
    assert state.execution is None and first.content == "one"
    attempts = [
        state.inject_message("user", "x"),
        state.update_message(first.id, content="x"),
        state.delete_message(first.id),
        state.set_env("GREETING", "x"),
    ]
    for attempt in attempts:
        with pytest.raises(errors.OutsideExecution, match="only allowed inside the thread's own execution"):
            await attempt
    assert [m["content"] for m in await stored(client, tid)] == ["one", "hi"]
    assert (await client.get(f"/threads/{tid}")).json()["env"] == {}


async def test_update_message_rewrites_and_announces(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(call("edit", text="edited"), "ok")
    app, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "original")
    rows = await stored(client, tid)
    assert rows[0]["content"] == "edited" and rows[0]["metadata"] == {"edited": 2}
    assert json.loads(results(rows)["edit"]) == {
        "content": "edited",
        "kept": ["edited", {"edited": 2}],
        "missing": "not found",
    }
    assert recorder.seen[1][1] == ("user", "edited")
    updates = [
        d["data"] for t, d in await stored_events(app, tid) if t == "message_data" and d["message_id"] == rows[0]["id"]
    ]
    assert [(u["content"], u["metadata"]) for u in updates] == [
        ("original", {}),
        ("edited", {"edited": True}),
        ("edited", {"edited": 2}),
    ]


async def test_delete_message_takes_its_tool_results_with_it(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(call("add", a=2, b=3), "It is 5.", call("drop"), "ok")
    _, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "2+3?")
    await say(drive, client, tid, "forget it")
    rows = await stored(client, tid)
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "2+3?"),
        ("assistant", "It is 5."),
        ("user", "forget it"),
        ("assistant", None),
        ("tool", "[true, false, false]"),
        ("assistant", "ok"),
    ]
    assert recorder.seen[3][1:3] == [("user", "2+3?"), ("assistant", "It is 5.")]


@define_tool(description="Deletes the result of the thread's first tool call.")
async def drop_result(state: ThreadState) -> str:
    page = await state.get_messages()
    target = next(m for m in page.messages if m.role == "tool")
    try:
        return str(await state.delete_message(target.id))
    except errors.ToolResultAlone as exc:
        return f"refused: {exc.code}"


async def test_delete_message_keeps_a_tool_result_with_its_call(app_factory: Any, drive: Any) -> None:
    """A result deleted alone would leave its call unanswered, which a provider refuses: `state.delete_message`
    refuses it as the HTTP delete does (`edits.delete`), and history stays whole."""
    recorder = Recorder(call("add", a=2, b=3), "It is 5.", call("drop_result"), "ok")
    _, client, tid = await start(app_factory, offering(catalog(recorder), drop_result))
    await say(drive, client, tid, "2+3?")
    await say(drive, client, tid, "forget the sum")
    rows = await stored(client, tid)
    assert [(m["role"], m["content"]) for m in rows] == [
        ("user", "2+3?"),
        ("assistant", None),
        ("tool", "5"),
        ("assistant", "It is 5."),
        ("user", "forget the sum"),
        ("assistant", None),
        ("tool", "refused: tool_result_alone"),
        ("assistant", "ok"),
    ]
    assert rows[1]["tool_calls"][0]["id"] == rows[2]["tool_call_id"]


# -- variables ------------------------------------------------------------------------------------------------


async def test_set_env_is_stored_and_seen_at_once(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(
        {
            "tool_calls": [
                {"name": "set_var", "arguments": {"name": "GREETING", "value": "hello"}},
                {"name": "read_var", "arguments": {"name": "GREETING"}},
                {"name": "set_var", "arguments": {"name": "TOKEN", "value": "t0ken"}},
                {"name": "set_var", "arguments": {"name": "KEY", "value": "k2"}},
                {"name": "set_var", "arguments": {"name": "bad name!", "value": "x"}},
            ]
        },
        "ok",
    )
    prompt = [{"type": "text", "content": "Say "}, {"type": "env", "property": "GREETING"}]
    app, client, tid = await start(app_factory, catalog(recorder, prompt), env={"KEY": "k1"}, secrets=["KEY"])
    await say(drive, client, tid, "go")
    tools = [m["content"] for m in await stored(client, tid) if m["role"] == "tool"]
    assert tools[:4] == ["hello", "hello", "***", "***"]  # a tool that echoes a secret has it masked (§8)
    assert "`bad name!` is not a variable name" in tools[4]  # the one name rule (`env.check_name`)
    assert recorder.seen[1][0] == ("system", "Say hello")
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["env"] == {"GREETING": "hello", "TOKEN": None, "KEY": None}
    assert thread["env_types"] == {"GREETING": "text", "TOKEN": "secret", "KEY": "secret"}
    async with app.state.runtime.sessions() as session:
        rows = await session.execute(select(tables.EnvValue.name, tables.EnvValue.value))
        values = {r.name: r.value for r in rows}
    assert values["GREETING"] == "hello"
    for name, plain in (("TOKEN", "t0ken"), ("KEY", "k2")):  # stored encrypted
        assert values[name] != plain and crypto.decrypt(app.state.runtime.fernet, values[name]) == plain


# -- tools ----------------------------------------------------------------------------------------------------


async def test_invoke_tool_returns_results_without_storing(app_factory: Any, drive: Any) -> None:
    app, client, tid = await start(app_factory, catalog(Recorder(call("invoker"), "ok")))
    await say(drive, client, tid, "go")
    rows = await stored(client, tid)
    assert [m["role"] for m in rows] == ["user", "assistant", "tool", "assistant"]
    got = json.loads(results(rows)["invoker"])
    assert got[0] == ["success", "3"]
    assert got[1][0] == "error" and "Invalid arguments for tool `add`" in got[1][1] and "`b`" in got[1][1]
    assert got[2] == ["error", "Tool `explode` failed: RuntimeError: kaboom"]
    assert got[3][0] == "error" and got[3][1].startswith("Unknown tool `nope`. Available tools: add, count, drop")
    assert got[4] == ["error", "Invalid arguments for tool `p`: missing `message`"]
    assert got[5] == ["error", "`agent` is an agent: subagents and handoffs cannot be run with `invoke_tool`"]
    assert [d["tool"] for t, d in await stored_events(app, tid) if t == "tool_started"] == ["invoker"]


@define_tool(description="Raises with its text.")
async def leak(state: ThreadState, args: TextArgs) -> str:
    raise RuntimeError(args.text)


@define_tool(description="Invokes `leak` with a secret.")
async def invoke_leak(state: ThreadState) -> str:
    return (await state.invoke_tool("leak", {"text": await state.env("KEY")})).text


async def tool_logs(client: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/threads/{tid}/logs", params={"kind": "tool", "limit": 100})
    assert response.status_code == 200, response.text
    return list(response.json()["logs"])


async def test_invoke_tool_writes_the_log_row_a_call_of_the_step_writes(app_factory: Any, drive: Any) -> None:
    """Each tool `state.invoke_tool` runs has its `logs` row, as a call of the step has (`tools.log_row`): its
    arguments, duration and error, known secrets masked; no message holds its result."""
    both = {"tool_calls": [{"name": "invoker", "arguments": {}}, {"name": "invoke_leak", "arguments": {}}]}
    cat = offering(catalog(Recorder(both, "ok")), leak, invoke_leak)
    _, client, tid = await start(app_factory, cat, env={"KEY": "k3y-value"}, secrets=["KEY"])
    await say(drive, client, tid, "go")
    rows = await tool_logs(client, tid)
    assert sorted((r["tool"], r["status"], r["request"].get("arguments")) for r in rows) == [
        ("add", "error", '{"a": "x"}'),
        ("add", "success", '{"a": 1, "b": 2}'),
        ("agent", "error", "{}"),
        ("explode", "error", "{}"),
        ("invoke_leak", "success", "{}"),
        ("invoker", "success", "{}"),
        ("leak", "error", '{"text": "***"}'),
        ("nope", "error", "{}"),
        ("p", "error", "{}"),
    ]
    errors_of = {(r["tool"], r["request"].get("arguments")): r["error"] for r in rows}
    assert errors_of[("add", '{"a": "x"}')].startswith("Invalid arguments for tool `add`")
    assert errors_of[("explode", "{}")] == "Tool `explode` failed: RuntimeError: kaboom"
    assert errors_of[("nope", "{}")].startswith("Unknown tool `nope`")
    assert errors_of[("p", "{}")] == "Invalid arguments for tool `p`: missing `message`"
    assert errors_of[("leak", '{"text": "***"}')] == "Tool `leak` failed: RuntimeError: ***"  # masked
    invoked = [r for r in rows if r["tool"] not in ("invoker", "invoke_leak")]
    assert all(r["message_id"] is None and r["latency_ms"] >= 0 for r in invoked)
    assert "k3y-value" not in json.dumps(rows)


async def test_a_queued_tool_delivered_later_writes_its_log_row(app_factory: Any, drive: Any) -> None:
    """`state.queue_tool` outside a tool call queues the call as input (`inputs.Kind.TOOL`); the step that delivers
    it (`inbox.deliver_tool`) runs it as the side's own call, and that writes its `logs` row like any call."""
    app, client, tid = await start(app_factory, catalog(Recorder("done")))
    state = await outside(app, tid)
    call_id = await state.queue_tool("add", {"a": 1, "b": 1})
    await settle(drive, client, tid)
    result = next(m for m in await stored(client, tid) if m["role"] == "tool")
    rows = await tool_logs(client, tid)
    assert [(r["tool"], r["status"], r["request"], r["message_id"]) for r in rows] == [
        (
            "add",
            "success",
            {"tool_call_id": call_id, "arguments": '{"a": 1, "b": 1}', "arguments_bytes": 16},
            result["id"],
        )
    ]
    assert rows[0]["latency_ms"] >= 0


async def test_queue_tool_joins_the_running_step(app_factory: Any, drive: Any) -> None:
    step = {
        "tool_calls": [
            {"name": "queuer", "arguments": {"name": "add"}},
            {"name": "queuer", "arguments": {"name": "explode"}},
        ]
    }
    recorder = Recorder(step, "ok")
    app, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "go")
    rows = await stored(client, tid)
    calls = rows[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["queuer", "queuer", "add"]
    assert json.loads(calls[2]["function"]["arguments"]) == {"a": 2, "b": 2}
    tools = [(m["tool_call_id"], m["name"], m["content"]) for m in rows if m["role"] == "tool"]
    assert tools[0] == (calls[0]["id"], "queuer", calls[2]["id"])
    assert tools[1][2].startswith("refused: `state.queue_tool`: side a is not offered a tool `explode`")
    assert tools[2] == (calls[2]["id"], "add", "4")
    assert recorder.seen[1][2:] == [
        ("assistant", None, ["queuer", "queuer", "add"]),
        ("tool", calls[2]["id"], "queuer"),
        ("tool", tools[1][2], "queuer"),
        ("tool", "4", "add"),
    ]
    # it ran within the step, before the step's stops were evaluated
    order = [(t, d.get("tool")) for t, d in await stored_events(app, tid) if t in ("tool_started", "step_completed")]
    assert order[:4] == [
        ("tool_started", "queuer"),
        ("tool_started", "queuer"),
        ("tool_started", "add"),
        ("step_completed", None),
    ]


async def test_queue_tool_on_an_idle_thread_starts_a_run(app_factory: Any, drive: Any) -> None:
    recorder = Recorder("done")
    app, client, tid = await start(app_factory, catalog(recorder))
    state = await outside(app, tid)
    with pytest.raises(errors.Invalid, match="not offered a tool `explode`"):
        await state.queue_tool("explode")
    call_id = await state.queue_tool("add", {"a": 1, "b": 1})
    await settle(drive, client, tid)
    rows = await stored(client, tid)
    assert [(m["role"], m["side"], m["content"]) for m in rows] == [
        ("assistant", "a", None),
        ("tool", "a", "2"),
        ("assistant", "a", "done"),
    ]
    assert rows[0]["tool_calls"][0]["id"] == call_id and rows[1]["tool_call_id"] == call_id
    assert recorder.seen[0][1:] == [("assistant", None, ["add"]), ("tool", "2", "add")]
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["number"] == 1 and thread["session"]["turns"] == 1


async def test_queue_tool_on_a_running_thread_runs_before_the_next_llm_call(app_factory: Any, drive: Any) -> None:
    recorder = Recorder(call("shout"), "done")
    holder: dict[str, RunState] = {}

    async def respond(request: LLMRequest) -> Any:
        if not recorder.seen:  # while the first LLM call is in flight, code outside the execution queues a call
            await holder["state"].queue_tool("add", {"a": 1, "b": 1})
        return recorder(request)

    app, client, tid = await start(app_factory, catalog(respond))
    holder["state"] = await outside(app, tid)
    await say(drive, client, tid, "go")
    rows = await stored(client, tid)
    assert [(m["role"], m["content"], [c["function"]["name"] for c in m["tool_calls"] or []]) for m in rows] == [
        ("user", "go", []),
        ("assistant", None, ["shout"]),
        ("tool", "ok", []),
        ("assistant", None, ["add"]),
        ("tool", "2", []),
        ("assistant", "done", []),
    ]
    assert recorder.seen[1][-2:] == [("assistant", None, ["add"]), ("tool", "2", "add")]
    assert [d for t, d in await stored_events(app, tid) if t == "turn_ended"] == [
        {"side": "a", "reason": "stop_on_response"}
    ]


# -- events ---------------------------------------------------------------------------------------------------


async def test_emit_sends_a_custom_event(app_factory: Any, drive: Any) -> None:
    app, client, tid = await start(app_factory, catalog(Recorder(call("shout"), "ok")))
    await say(drive, client, tid, "go")
    assert ("event", {"event_type": "shout", "data": {"loud": True}}) in await stored_events(app, tid)


async def test_context_lives_for_the_execution(app_factory: Any, drive: Any) -> None:
    twice = {"tool_calls": [{"name": "count"}, {"name": "count"}]}
    recorder = Recorder(twice, call("count"), "ok", call("count"), "again")
    _, client, tid = await start(app_factory, catalog(recorder))
    await say(drive, client, tid, "go")
    await say(drive, client, tid, "more")
    results = [
        r["content"] for r in (await client.get(f"/threads/{tid}/messages")).json()["messages"] if r["role"] == "tool"
    ]
    assert results == ["1", "2", "3", "1"]  # shared across the steps of one execution, fresh in the next


@define_tool(description="Terminates the thread.")
async def end_all(state: ThreadState) -> str:
    await state.terminate()
    return "never stored"


async def test_terminate_from_a_tool_ends_the_thread(app_factory: Any, drive: Any) -> None:
    cat = offering(catalog(Recorder(call("end_all"), "unreachable")), end_all)
    _, client, tid = await start(app_factory, cat)
    assert (await client.post(f"/threads/{tid}/messages", json={"content": "go"})).status_code == 202
    await drive(client._transport.app)  # type: ignore[attr-defined]
    body = (await client.get(f"/threads/{tid}")).json()
    assert body["status"] == "terminated"
    assert body["terminated_at"] is not None and body["session"]["reason"] == "terminated"
    rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    assert [(r["role"], r["tool_status"], r["content"]) for r in rows][1:] == [
        ("assistant", None, None),
        ("tool", "error", "Thread terminated"),  # the open call is closed; the tool's own result never lands
    ]
    denied = await client.post(f"/threads/{tid}/messages", json={"content": "more"})
    assert denied.status_code == 409
