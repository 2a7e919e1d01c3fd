"""Subagents (§6): blocking × resumable, the exact parent-notification texts, attachments both ways, the registry,
`maxInstances`, explicit communication, and cascades."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import children, errors, keys, tables, threads
from app.catalog import Catalog
from app.engine import child_tools
from app.llm.base import LLMRequest
from app.spec import (
    ThreadState,
    ToolEntry,
    ToolResult,
    define_agent,
    define_hook,
    define_model,
    define_prompt,
    define_tool,
)
from tests.conftest import client_for, wait_for
from tests.test_engine import event_types, stored

REF = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@define_tool(description="Write the note the reviewer approves.")
async def write_note(state: ThreadState) -> str:
    record = await state.write_file("/out/note.txt", "checked by qa\n", "text/plain")
    return record.path


@define_tool(description="Ask the parent something.")
async def ask_parent(state: ThreadState) -> str:
    await state.notify_parent("Which colour? I need an answer.")
    await state.set_status("asking the parent")
    await state.write_file("/out/note.txt", "asked\n")
    return "asked"


@define_tool(description="Look at the children.")
async def inspect_children(state: ThreadState) -> dict[str, Any]:
    [child] = state.children
    handle = await state.get_child_thread(child.reference)
    assert handle is not None and handle.execution is None
    parent = await handle.get_parent_thread()
    assert await state.get_child_thread(str(uuid.uuid4())) is None
    # the child's first message is stored when the child's run takes it from its inbox, which a worker does beside
    # this run: wait for it (bounded) rather than count on the child winning
    for _ in range(250):
        messages = (await handle.get_messages(include_silent=True)).messages
        if messages:
            break
        await asyncio.sleep(0.02)
    return {
        "child": [child.name, child.status, child.resumable],
        "child_first_message": messages[0].content if messages else None,
        "childs_parent": parent.thread_id if parent else None,
        "my_parent": await state.get_parent_thread(),
    }


def last_of(request: LLMRequest) -> Any:
    """The last message before the registry system message the runtime appends for a parent with children."""
    return next(
        m
        for m in reversed(request.messages)
        if not (m.role == "system" and (m.content or "").startswith("Subagents of"))
    )


class Brain:
    """One `respond` for every prompt: it dispatches on the system prompt and records what each prompt saw."""

    def __init__(self, boss: Any, reviewer: str = "approve", hold: asyncio.Event | None = None) -> None:
        self.boss = boss
        self.reviewer = reviewer
        self.hold = hold
        self.seen: dict[str, list[LLMRequest]] = {}

    async def __call__(self, request: LLMRequest) -> Any:
        who = (request.messages[0].content or "").split(".")[0]
        self.seen.setdefault(who, []).append(request)
        last = last_of(request)
        if who == "boss":
            return self.boss(request)
        if who == "worker":
            if self.hold is not None:
                await self.hold.wait()
            if last.role == "tool":
                return "draft ready"
            if "explicit" in (last.content or ""):
                return {"tool_calls": [{"name": "ask_parent"}]}
            return {"tool_calls": [{"name": "write_note"}]}
        # the reviewer
        if self.reviewer == "approve":
            return {
                "tool_calls": [{"name": "approve", "arguments": {"summary": "looks good", "files": ["/out/note.txt"]}}]
            }
        if self.reviewer == "reject":
            return {"tool_calls": [{"name": "reject", "arguments": {"reason": "too vague"}}]}
        if self.reviewer == "status":  # reports progress (`sessionStatus`), then approves
            if last.role == "tool":
                return {"tool_calls": [{"name": "approve", "arguments": {"summary": "looks good", "files": []}}]}
            return {"tool_calls": [{"name": "progress", "arguments": {"note": "reviewing page 2"}}]}
        return "keep going"  # never a terminal tool: the turn cap ends the session


def catalog(
    brain: Brain, entry: dict[str, Any], *, terminal: bool = True, variables: list[dict[str, Any]] | None = None
) -> Catalog:
    model = define_model(name="m", provider="test", respond=brain)
    boss = define_prompt(name="boss", model="m", prompt="boss. Delegate.", include_chat=True,
                         include_past_tools=True, tools=[entry, "inspect_children"])  # fmt: skip
    worker = define_prompt(name="worker", model="m", prompt="worker. Do it.", include_chat=True,
                           include_past_tools=True, tools=["write_note", "ask_parent"])  # fmt: skip
    reviewer = define_prompt(name="reviewer", model="m", prompt="reviewer. Check it.", include_chat=True)
    sides: dict[str, Any] = {"label": "Reviewer", "prompt": "reviewer", "stop_on_response": True}
    if terminal:
        sides["session_stop"] = {"name": "approve", "message_property": "summary", "attachments_property": "files"}
        sides["session_fail"] = {"name": "reject", "message_property": "reason"}
        sides["session_status"] = {"name": "progress", "message_property": "note"}
    qa = define_agent(
        name="qa", type="dual_ai", title="QA", expose_as_tool=True, tool_description="Checks work.",
        max_session_turns=4, side_a={"label": "Worker", "prompt": "worker", "stop_on_response": True}, side_b=sides,
        variables=variables or [],
    )  # fmt: skip
    agent = define_agent(name="boss", side_a={"prompt": "boss"})
    return Catalog(
        root=Path("."),
        models={"m": model},
        prompts={"boss": boss, "worker": worker, "reviewer": reviewer},
        agents={"boss": agent, "qa": qa},
        tools={"write_note": write_note, "ask_parent": ask_parent, "inspect_children": inspect_children},
    )


def delegate(**extra: Any) -> Any:
    """The boss: delegates the user's first message, then reports what came back."""

    def boss(request: LLMRequest) -> Any:
        last = last_of(request)
        if last.role == "user" and last.content and last.content.startswith("go"):
            return {"tool_calls": [{"name": "qa", "arguments": {"message": "check the report", **extra}}]}
        return f"boss saw: {last.content}"

    return boss


async def start(app_factory: Any, cat: Catalog, *, worker: bool = True) -> tuple[FastAPI, httpx.AsyncClient, str]:
    """An app with a worker (or none: the test runs its threads with `drive`) and a new thread of the boss."""
    app: FastAPI = await app_factory(cat, with_worker=worker)
    client = client_for(app)
    created = await client.post("/threads", json={"agent": "boss"})
    assert created.status_code == 201, created.text
    return app, client, created.json()["id"]


async def until(client: httpx.AsyncClient, tid: str, check: Any, timeout: float = 60) -> list[dict[str, Any]]:
    async def ready() -> list[dict[str, Any]] | None:
        rows = await stored(client, tid)
        return rows if check(rows) else None

    result: list[dict[str, Any]] = await wait_for(ready, timeout=timeout)
    return result


async def ran(drive: Any, app: FastAPI, client: httpx.AsyncClient, tid: str, check: Any) -> list[dict[str, Any]]:
    """Run what is runnable to its end, the parent and its children in turn (no worker: `drive`); the thread's
    messages, which `check` must accept."""
    await drive(app)
    rows = await stored(client, tid)
    assert check(rows), rows
    return rows


def said(text: str) -> Any:
    return lambda rows: any(r["role"] == "assistant" and (r["content"] or "").startswith(text) for r in rows)


async def registry(client: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    response = await client.get(f"/threads/{tid}/subagents")
    assert response.status_code == 200, response.text
    return list(response.json()["subagents"])


# -- blocking, non-resumable --------------------------------------------------------------------------------


async def test_blocking_child_parks_the_parent_without_a_lease_and_answers_the_call(app_factory: Any) -> None:
    hold = asyncio.Event()
    brain = Brain(delegate(attachments=["/brief.txt"]), hold=hold)
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}))
    await client.put(f"/threads/{tid}/fs/brief.txt", content=b"the brief", headers={"content-type": "text/plain"})
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})

    async def parked() -> bool:
        async with app.state.runtime.sessions() as session:
            row = await session.get(tables.Thread, uuid.UUID(tid))
            return bool(row and row.status == "waiting" and row.lease_token is None and row.runnable_since is None)

    await wait_for(parked)  # the parent waits on its child holding no worker and no lease
    [child] = await registry(client, tid)
    assert (child["name"], child["title"], child["description"]) == ("qa", "QA", "Checks work.")
    assert (child["resumable"], child["blocking"], child["status"]) == (False, True, "running")
    hold.set()
    rows = await until(client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    cid = child["reference"]
    assert tool["content"] == f"looks good\n\nReference: {cid}" and tool["tool_status"] == "success"
    assert tool["subagent_id"] == cid
    projected = {k: tool[k] for k in ("subagent_name", "subagent_title", "subagent_status", "subagent_blocking")}
    assert projected == {"subagent_name": "qa", "subagent_title": "QA", "subagent_status": "terminated",
                         "subagent_blocking": True}  # fmt: skip
    [ref] = tool["attachments"]  # copied child → parent, with a parent-local path
    assert ref["path"].startswith("/attachments/note-") and ref["name"] == "note.txt"
    assert (await client.get(f"/threads/{tid}/fs{ref['path']}")).content == b"checked by qa\n"
    assert rows[-1]["content"].startswith(f"boss saw: looks good\n\nReference: {cid}")
    # the child got the parent's attachment under a child-local path, and ran one session, then ended
    first = (await stored(client, cid))[0]
    assert first["content"] == "check the report" and first["role"] == "user"
    [brief] = first["attachments"]
    assert brief["path"].startswith("/attachments/brief-") and brief["name"] == "brief.txt"
    assert (await client.get(f"/threads/{cid}/fs{brief['path']}")).content == b"the brief"
    child_thread = (await client.get(f"/threads/{cid}")).json()
    assert child_thread["status"] == "terminated" and child_thread["parent_id"] == tid
    assert (await registry(client, tid))[0]["status"] == "terminated"
    kinds = [e for e, _ in await event_types(client, tid)]
    assert "subagent_created" in kinds and "subagent_status" in kinds
    statuses = [d["status"] for e, d in await event_types(client, tid) if e == "thread_status"]
    assert "waiting" in statuses


async def test_a_failed_blocking_child_is_an_error_result(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate(), reviewer="reject")
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    assert tool["tool_status"] == "error"
    assert re.fullmatch(r"too vague\n\nReference: " + REF.pattern, tool["content"])
    [logged] = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]
    assert (logged["tool"], logged["status"], logged["error"]) == ("qa", "error", tool["content"])
    assert logged["message_id"] == tool["id"] and logged["request"]["subagent_id"] == tool["subagent_id"]


async def test_a_child_that_never_calls_a_terminal_tool_stopped_before_completion(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate(), reviewer="loop")
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa", "blocking": False}), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(
        drive, app, client, tid, lambda rs: any("has reported a failure" in (r["content"] or "") for r in rs)
    )
    message = next(r for r in rows if "has reported a failure" in (r["content"] or ""))
    cid = message["metadata"]["subagent_id"]
    assert message["content"] == (
        f"Subagent (reference: {cid}) has reported a failure:\n\nSubagent execution stopped before completion "
        "(max_session_turns). It did not call a terminal session tool (sessionStop/sessionFail)."
    )


async def test_an_agent_without_terminal_tools_returns_its_last_message(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate(), reviewer="loop")
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}, terminal=False), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    assert tool["tool_status"] == "success" and tool["content"].startswith("keep going\n\nReference: ")


async def test_a_childs_session_status_call_updates_the_parents_registry_live(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate(), reviewer="status")
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    await ran(drive, app, client, tid, said("boss saw"))
    reports = [d for e, d in await event_types(client, tid) if e == "subagent_status"]
    # the status text reached the parent's stream as it was reported, before the child's session ended
    assert [d["status"] for d in reports][-2:] == ["reviewing page 2", "terminated"]
    [child] = await registry(client, tid)
    assert reports[-2].keys() == child.keys()  # the whole registry entry
    assert {k: v for k, v in reports[-2].items() if k not in ("status", "created_at")} == {
        k: v for k, v in child.items() if k not in ("status", "created_at")
    }


async def test_a_child_stopped_by_the_turn_cap_is_a_failure_everywhere(app_factory: Any, drive: Any) -> None:
    create = {"name": "subagent_create", "arguments": {"agent": "qa", "message": "first job", "attachments": []}}
    brain = Brain(manager([create]), reviewer="loop")
    entry = {"name": "qa", "blocking": False, "resumable": {"receives_messages": "side_a"}}
    app, client, tid = await start(app_factory, catalog(brain, entry), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await ran(
        drive, app, client, tid, lambda rs: any("has reported a failure" in (r["content"] or "") for r in rs)
    )
    cid = next(r for r in rows if "has reported a failure" in (r["content"] or ""))["metadata"]["subagent_id"]
    session = (await client.get(f"/threads/{cid}")).json()["session"]
    assert (session["status"], session["reason"]) == ("failure", "max_session_turns")
    ended = [d for e, d in await event_types(client, cid) if e == "session_ended"]
    assert ended == [{"status": "failure", "reason": "max_session_turns"}]
    [child] = await registry(client, tid)
    assert child["status"] == "failed"
    reports = [d["status"] for e, d in await event_types(client, tid) if e == "subagent_status"]
    assert reports[-1] == "failed"


async def test_missing_init_attachments_are_named_with_the_contracts_text(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate(attachments=["/attachments/gone.txt", "/brief.txt", "/attachments/lost.png"]))
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}), worker=False)
    await client.put(f"/threads/{tid}/fs/brief.txt", content=b"the brief", headers={"content-type": "text/plain"})
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    assert tool["tool_status"] == "error"
    assert tool["content"] == (
        "Provided attachment path(s) not found in this thread: /attachments/gone.txt, /attachments/lost.png. "
        "Use an exact /attachments/... path that exists in this thread, then try again."
    )
    assert await registry(client, tid) == []


# -- non-blocking -------------------------------------------------------------------------------------------


async def test_non_blocking_child_reports_with_the_exact_texts(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate())
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa", "blocking": False}), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(
        drive, app, client, tid, lambda rs: sum(bool(r["role"] == "assistant" and r["content"]) for r in rs) >= 2
    )
    tool = next(r for r in rows if r["role"] == "tool")
    cid = tool["subagent_id"]
    assert tool["content"] == f"The subagent was initiated successfully. Reference: {cid}"
    report = next(r for r in rows if (r["metadata"] or {}).get("subagent_id") == cid)
    assert report["silent"] is True and report["role"] == "user" and report["subagent_id"] == cid
    [ref] = report["attachments"]
    assert report["content"] == (
        f"Subagent (reference: {cid}) has returned the following result:\n\nlooks good"
        f"\n\nThe subagent also returned the following attachment(s):\n\n{ref['path']}"
    )
    assert rows[-1]["content"].startswith(f"boss saw: Subagent (reference: {cid})")
    registry = brain.seen["boss"][-1].messages[-1]  # the parent's model sees its children after the history
    assert registry.role == "system" and registry.content == (
        "Subagents of this thread (use their reference to address them):\n"
        f"- {cid}: qa — terminated (one session, non-blocking): Checks work."  # with the child's description
    )


PROJECTED = ("subagent_name", "subagent_title", "subagent_description", "subagent_resumable", "subagent_blocking")


@define_tool(description="Read this thread's messages that speak for a child.")
async def own_messages(state: ThreadState) -> str:
    page = await state.get_messages(include_silent=True)
    report = next(m for m in page.messages if m.subagent_id and m.role == "user")
    updated = await state.update_message(report.id, metadata={**report.metadata, "read": True})
    found = [[m.subagent_id, *(getattr(m, k) for k in PROJECTED)] for m in page.messages if m.subagent_id]
    return json.dumps([*found, [updated.subagent_id, *(getattr(updated, k) for k in PROJECTED)]])


async def test_messages_of_a_child_carry_its_projection_in_events_and_state(app_factory: Any, drive: Any) -> None:
    """`message_data` has the `subagent_*` fields `GET /messages` has, and so has `StateMessage` (§6.5)."""

    def boss(request: LLMRequest) -> Any:
        last = last_of(request)
        if last.role == "user" and last.content == "go":
            return {"tool_calls": [{"name": "qa", "arguments": {"message": "check the report"}}]}
        if (last.content or "").startswith("Subagent (reference:"):
            return {"tool_calls": [{"name": "own_messages"}]}
        return f"boss saw: {last.content}"

    cat = catalog(Brain(boss), {"name": "qa", "blocking": False})
    cat = dataclasses.replace(cat, tools={**cat.tools, "own_messages": own_messages})
    cat.prompts["boss"].tools.append("own_messages")
    app, client, tid = await start(app_factory, cat, worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(
        drive, app, client, tid, lambda rs: any(r["name"] == "own_messages" for r in rs if r["role"] == "tool")
    )
    tool, report = [r for r in rows if r["subagent_id"]]
    cid = tool["subagent_id"]
    assert report["subagent_id"] == cid and report["content"].startswith(f"Subagent (reference: {cid}) has returned")
    expected = ["qa", "QA", "Checks work.", False, False]
    assert [tool[k] for k in PROJECTED] == [report[k] for k in PROJECTED] == expected
    # every announcement of those messages carries the projection too, as the child was when it was written
    announced = [
        d["data"] for e, d in await event_types(client, tid) if e == "message_data" and d["data"]["subagent_id"]
    ]
    assert {d["id"] for d in announced} == {tool["id"], report["id"]}
    for data in announced:
        assert [data[k] for k in PROJECTED] == expected and data["subagent_status"] in ("running", "idle", "terminated")
        assert data["subagent_thread_name"] is None and data["subagent_spawn_group_id"] is None
    # the messages of other threads project nothing: only the thread's own children are in its registry
    assert [d["data"].get("subagent_name") for e, d in await event_types(client, tid) if e == "message_data"].count(
        None
    ) == len([e for e, d in await event_types(client, tid) if e == "message_data"]) - len(announced)
    seen = json.loads(next(r["content"] for r in rows if r["name"] == "own_messages"))
    assert seen == [[cid, *expected], [cid, *expected], [cid, *expected]]  # the last: `update_message`'s answer


async def test_a_metadata_subagent_id_of_a_thread_that_is_no_child_projects_nothing(
    app_factory: Any, drive: Any
) -> None:
    brain = Brain(lambda request: "fine")
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}), worker=False)
    other = (await client.post("/threads", json={"agent": "qa"})).json()["id"]
    posted = {"content": "hi", "metadata": {"subagent_id": other}}
    assert (await client.post(f"/threads/{tid}/messages", json=posted)).status_code == 202
    rows = await ran(drive, app, client, tid, said("fine"))
    assert rows[0]["subagent_id"] == other and rows[0]["subagent_name"] is None
    [data] = [d["data"] for e, d in await event_types(client, tid) if e == "message_data" and d["data"]["subagent_id"]]
    assert "subagent_name" not in data


async def test_non_resumable_arguments_are_checked_against_the_childs_schema(app_factory: Any, drive: Any) -> None:
    script = [
        {"name": "qa", "arguments": {"msg": "check it"}},
        {"name": "qa", "arguments": {"message": 42}},
    ]
    brain = Brain(manager(script))
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    errors_ = [(r["tool_status"], r["content"]) for r in rows if r["role"] == "tool"]
    assert errors_ == [
        ("error", "Invalid arguments for tool `qa`: missing `message`"),
        ("error", "Invalid arguments for tool `qa`: `message` must be of type string"),
    ]
    assert await registry(client, tid) == []  # nothing was created


@define_tool(description="Queue a call of the optional subagent, and try to set a status.")
async def queue_qa(state: ThreadState) -> str:
    try:
        await state.set_status("busy")
        status = "set"
    except errors.Invalid as exc:
        status = exc.message
    call_id = await state.queue_tool("qa", {"message": "queued job"})
    return json.dumps([call_id, status])


async def test_queue_tool_queues_an_optional_subagent_set_status_needs_a_parent(app_factory: Any, drive: Any) -> None:
    brain = Brain(manager([{"name": "queue_qa", "arguments": {}}]))
    cat = catalog(brain, {"name": "qa", "optional": "USE_QA", "blocking": False})
    cat = dataclasses.replace(cat, tools={**cat.tools, "queue_qa": queue_qa})
    cat.prompts["boss"].tools.append("queue_qa")
    app = await app_factory(
        cat,
    )
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "boss", "env": {"USE_QA": "yes"}})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    call_id, status = json.loads(next(r["content"] for r in rows if r["name"] == "queue_qa"))
    assert status == "`state.set_status` is for subagents: this thread has no parent"
    assert not any(d.get("status_text") for e, d in await event_types(client, tid) if e == "thread_status")
    queued = next(r for r in rows if r["tool_call_id"] == call_id)
    assert queued["name"] == "qa" and queued["content"].startswith("The subagent was initiated successfully.")
    [child] = await registry(client, tid)
    first = (await stored(client, child["reference"]))[0]
    assert first["content"] == "queued job"


# -- tool hooks ---------------------------------------------------------------------------------------------


def hooked(cat: Catalog, seen: list[tuple[str, Any]]) -> Catalog:
    """The boss with every tool-result hook, each recording what it got and marking what it returns."""

    @define_hook("after_tool_call_success")
    async def after_success(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        seen.append(("after_tool_call_success", json.loads(tool_call["function"]["arguments"])))
        return ToolResult(status="success", result=f"{result.result} +after")

    @define_hook("after_tool_call_failure")
    async def after_failure(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        seen.append(("after_tool_call_failure", result.error))
        return ToolResult(status="error", error=f"{result.error} +failed")

    @define_hook("before_store_tool_result")
    async def before_store(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        seen.append(("before_store_tool_result", tool_call["function"]["name"]))
        return result.model_copy(update={"result": f"{result.result} +stored"} if result.result else {})

    @define_hook("before_create_message")
    async def before_create(state: ThreadState, message: dict[str, Any]) -> dict[str, Any]:
        if message["role"] == "tool":
            seen.append(("before_create_message", message["content"]))
            message["metadata"] = {**message["metadata"], "hooked": True}
        return message

    @define_hook("after_create_message")
    async def after_create(state: ThreadState, message: Any) -> None:
        if message.role == "tool":
            seen.append(("after_create_message", message.content))

    found = [after_success, after_failure, before_store, before_create, after_create]
    boss = define_agent(name="boss", side_a={"prompt": "boss"}, hooks=[h.name for h in found])
    return dataclasses.replace(cat, agents={**cat.agents, "boss": boss}, hooks={h.name: h for h in found})


async def test_a_subagent_call_answered_at_once_runs_the_tool_hooks(app_factory: Any, drive: Any) -> None:
    seen: list[tuple[str, Any]] = []
    cat = hooked(catalog(Brain(delegate()), {"name": "qa", "blocking": False}), seen)
    app, client, tid = await start(app_factory, cat, worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(
        drive, app, client, tid, lambda rs: sum(bool(r["role"] == "assistant" and r["content"]) for r in rs) >= 2
    )
    tool = next(r for r in rows if r["role"] == "tool")
    cid = tool["subagent_id"]
    text = f"The subagent was initiated successfully. Reference: {cid} +after +stored"
    assert (tool["content"], tool["metadata"]) == (text, {"hooked": True})
    assert seen == [
        ("after_tool_call_success", {"message": "check the report"}),
        ("before_store_tool_result", "qa"),
        ("before_create_message", text),
        ("after_create_message", text),
    ]


async def test_a_blocking_subagents_result_runs_the_tool_hooks(app_factory: Any, drive: Any) -> None:
    seen: list[tuple[str, Any]] = []
    app, client, tid = await start(app_factory, hooked(catalog(Brain(delegate()), {"name": "qa"}), seen), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    text = f"looks good\n\nReference: {tool['subagent_id']} +after +stored"
    assert (tool["content"], tool["metadata"], tool["tool_status"]) == (text, {"hooked": True}, "success")
    assert tool["attachments"][0]["name"] == "note.txt"  # the child's files come back as before
    assert seen == [
        ("after_tool_call_success", {"message": "check the report"}),  # the arguments the model called it with
        ("before_store_tool_result", "qa"),
        ("before_create_message", text),
        ("after_create_message", text),
    ]
    assert rows[-1]["content"].startswith(f"boss saw: {text}")


async def test_a_failed_blocking_subagent_runs_the_failure_hook(app_factory: Any, drive: Any) -> None:
    seen: list[tuple[str, Any]] = []
    brain = Brain(delegate(), reviewer="reject")
    app, client, tid = await start(app_factory, hooked(catalog(brain, {"name": "qa"}), seen), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    assert (tool["content"], tool["tool_status"]) == (f"too vague\n\nReference: {tool['subagent_id']} +failed", "error")
    assert [name for name, _ in seen][:2] == ["after_tool_call_failure", "before_store_tool_result"]


def refusing(cat: Catalog, hook: Any) -> Catalog:
    """The boss with one tool-result hook."""
    boss = define_agent(name="boss", side_a={"prompt": "boss"}, hooks=[hook.name])
    return dataclasses.replace(cat, agents={**cat.agents, "boss": boss}, hooks={hook.name: hook})


@define_hook("after_tool_call_success")
async def refuse(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
    return ToolResult(status="error", error=f"refused: {result.result}")


async def tool_logs(client: httpx.AsyncClient, tid: str) -> list[dict[str, Any]]:
    return list((await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"])


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_subagent_calls_log_row_holds_the_result_as_stored(
    app_factory: Any, drive: Any, blocking: bool
) -> None:
    """As a callable's (`tool_phase`): the row says what the hooks made of the result, with the message holding it,
    whether the call is answered at once or by the child's result later."""
    cat = refusing(catalog(Brain(delegate()), {"name": "qa", "blocking": blocking}), refuse)
    app, client, tid = await start(app_factory, cat, worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    assert tool["tool_status"] == "error" and tool["content"].startswith("refused: ")
    [logged] = await tool_logs(client, tid)
    assert (logged["tool"], logged["status"], logged["error"]) == ("qa", "error", tool["content"])
    assert logged["message_id"] == tool["id"] and logged["request"]["subagent_id"] == tool["subagent_id"]


class Leaky(Brain):
    """The reviewer rejects with a reason that holds the parent's secret."""

    async def __call__(self, request: LLMRequest) -> Any:
        if (request.messages[0].content or "").startswith("reviewer."):
            return {"tool_calls": [{"name": "reject", "arguments": {"reason": "too vague for s3cr3t-val"}}]}
        return await super().__call__(request)


async def test_a_blocking_childs_log_row_is_a_callables(app_factory: Any, drive: Any) -> None:
    """The call's arguments and its duration from the child's creation to its result, secrets masked in both and
    in the error, as `tools.log_row` writes a callable's."""
    brain = Leaky(delegate(message="check the report of s3cr3t-val"))
    app: FastAPI = await app_factory(catalog(brain, {"name": "qa"}))
    client = client_for(app)
    body = {"agent": "boss", "env": {"TOKEN": "s3cr3t-val"}, "secrets": ["TOKEN"]}
    tid = (await client.post("/threads", json=body)).json()["id"]
    before = time.monotonic()
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    elapsed_ms = (time.monotonic() - before) * 1000
    tool = next(r for r in rows if r["role"] == "tool")
    [child] = await registry(client, tid)
    assert tool["content"] == f"too vague for s3cr3t-val\n\nReference: {child['reference']}"  # what the model reads
    [logged] = await tool_logs(client, tid)
    assert (logged["status"], logged["error"]) == ("error", f"too vague for ***\n\nReference: {child['reference']}")
    assert logged["request"]["arguments"] == '{"message": "check the report of ***"}'
    assert logged["request"]["arguments_bytes"] == len('{"message": "check the report of s3cr3t-val"}')
    assert 0 < logged["latency_ms"] < elapsed_ms  # the child's whole session ran in between
    assert "s3cr3t-val" not in str(await tool_logs(client, tid))


async def test_a_blocking_childs_result_dropped_by_a_hook_completes_the_step(app_factory: Any, drive: Any) -> None:
    """As a callable's dropped result: the call leaves history, the step that made it completes, the run goes
    on with the next step."""

    @define_hook("after_tool_call_success")
    async def forget(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult | None:
        return None

    answers: list[str] = []

    def boss(request: LLMRequest) -> Any:
        answers.append("called")
        if len(answers) == 1:
            return {"tool_calls": [{"name": "qa", "arguments": {"message": "check the report"}}]}
        return "boss went on"

    app, client, tid = await start(app_factory, refusing(catalog(Brain(boss), {"name": "qa"}), forget), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss went on"))
    assert [(r["role"], r["tool_calls"]) for r in rows] == [("user", None), ("assistant", None), ("assistant", None)]
    steps = [(e, d["step"]) for e, d in await event_types(client, tid) if e in ("step_started", "step_completed")]
    assert steps == [("step_started", 1), ("step_completed", 1), ("step_started", 2), ("step_completed", 2)]
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "idle"


# -- resumable ----------------------------------------------------------------------------------------------


def manager(script: list[Any]) -> Any:
    """The boss calls the tools of `script` in order, one per LLM call, then answers in words."""
    calls = iter(script)

    def boss(request: LLMRequest) -> Any:
        step = next(calls, None)
        if step is None:
            return f"boss saw: {last_of(request).content}"
        return {"tool_calls": [step(request) if callable(step) else step]}

    return boss


def reference(request: LLMRequest) -> str:
    text = "\n".join(m.content or "" for m in request.messages if m.role == "tool")
    found = REF.findall(text)
    assert found, text
    return str(found[0])


async def test_resumable_create_limit_message_and_later_sessions(app_factory: Any, drive: Any) -> None:
    create = {"name": "subagent_create", "arguments": {"agent": "qa", "message": "first job", "attachments": []}}
    script = [
        create,
        create,  # over maxInstances
        lambda r: {"name": "subagent_message",
                   "arguments": {"referenceId": reference(r), "message": "second job", "attachments": []}},
        {"name": "subagent_message",
         "arguments": {"referenceId": str(uuid.uuid4()), "message": "x", "attachments": []}},
    ]  # fmt: skip
    brain = Brain(manager(script))
    entry = {"name": "qa", "resumable": {"receives_messages": "side_a", "max_instances": 1}}
    app, client, tid = await start(app_factory, catalog(brain, entry), worker=False)
    offered = None
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    offered = {t.name: t for t in brain.seen["boss"][0].tools}
    assert "qa" not in offered and {"subagent_create", "subagent_message"} <= set(offered)
    assert offered["subagent_create"].parameters["properties"]["agent"]["enum"] == ["qa"]
    tools_ = [r for r in rows if r["role"] == "tool"]
    cid = tools_[0]["subagent_id"]
    assert tools_[0]["content"] == f"looks good\n\nReference: {cid}"  # blocking by default
    assert tools_[1]["content"] == (
        'Subagent instance limit reached for "qa" (1). Use subagent_message with an existing reference instead. '
        f"Active references: {cid}"
    )
    assert tools_[2]["content"] == f"looks good\n\nReference: {cid}"  # a second session of the same child
    assert re.fullmatch(r'Subagent reference "' + REF.pattern + r'" is not active\.', tools_[3]["content"])
    child = (await client.get(f"/threads/{cid}")).json()
    assert child["status"] == "idle" and child["session"]["number"] == 2  # still addressable
    [entry_] = await registry(client, tid)
    assert entry_["resumable"] is True and entry_["status"] == "idle"
    worker_inputs = [r["content"] for r in await stored(client, cid) if r["role"] == "user" and r["side"] == "b"]
    assert worker_inputs[:1] == ["first job"] and "second job" in worker_inputs


def test_a_resumable_subagent_at_its_cap_leaves_the_create_enum() -> None:
    """Only the capped agent leaves `subagent_create`'s enum; with none left there is no `subagent_create`, while
    `subagent_message` stays (skill guide 0.14.1)."""
    cat = catalog(Brain(lambda request: "x"), {"name": "qa", "resumable": {"receives_messages": "side_a"}})
    aux = cat.agents["qa"].model_copy(update={"name": "aux"})
    boss = cat.prompts["boss"]
    aux_entry = ToolEntry.model_validate({"name": "aux", "resumable": {"receives_messages": "side_a"}})
    boss = boss.model_copy(update={"tools": [*boss.tools, aux_entry]})
    cat = dataclasses.replace(cat, prompts={**cat.prompts, "boss": boss}, agents={**cat.agents, "aux": aux})

    def offer(full: frozenset[str]) -> dict[str, Any]:
        return {t.name: t.parameters for t in child_tools.offered(cat, cat.prompts["boss"], None, full)}

    assert offer(frozenset())["subagent_create"]["properties"]["agent"]["enum"] == ["qa", "aux"]
    assert offer(frozenset({"qa"}))["subagent_create"]["properties"]["agent"]["enum"] == ["aux"]
    assert set(offer(frozenset({"qa", "aux"}))) == {"subagent_message"}


async def test_a_resumable_subagent_at_its_cap_is_offered_for_messages_only(app_factory: Any, drive: Any) -> None:
    """At `max_instances` live instances, `subagent_create` is no longer offered (0.14.1: "when reached the tool is
    hidden and new messages route to existing instances"), counted afresh at every step: a stale create still gets
    the limit error, and once the instance is terminated creation is offered again."""
    create = {"name": "subagent_create", "arguments": {"agent": "qa", "message": "a job", "attachments": []}}
    script = [
        create,
        lambda r: {"name": "subagent_message",
                   "arguments": {"referenceId": reference(r), "message": "more", "attachments": []}},
        create,  # stale: the tool is not offered
    ]  # fmt: skip
    brain = Brain(manager(script))
    entry = {"name": "qa", "resumable": {"receives_messages": "side_a", "max_instances": 1}}
    app, client, tid = await start(app_factory, catalog(brain, entry), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    offered = [{t.name for t in request.tools} for request in brain.seen["boss"]]
    assert "subagent_create" in offered[0] and "subagent_message" in offered[0]
    assert all("subagent_create" not in names and "subagent_message" in names for names in offered[1:]), offered
    results = [r for r in rows if r["role"] == "tool"]
    cid = results[0]["subagent_id"]
    assert results[1]["content"] == f"looks good\n\nReference: {cid}"  # the message reached the existing one
    assert results[2]["content"] == (
        'Subagent instance limit reached for "qa" (1). Use subagent_message with an existing reference instead. '
        f"Active references: {cid}"
    )
    assert (await client.post(f"/threads/{cid}/terminate")).status_code == 200
    await client.post(f"/threads/{tid}/messages", json={"content": "again"})
    await ran(drive, app, client, tid, lambda rs: sum(said("boss saw")([r]) for r in rs) >= 2)
    assert "subagent_create" in {t.name for t in brain.seen["boss"][-1].tools}


async def test_explicit_communication_sends_only_what_the_child_says(app_factory: Any, drive: Any) -> None:
    create = {"name": "subagent_create", "arguments": {"agent": "qa", "message": "explicit job", "attachments": []}}
    brain = Brain(manager([create]))
    entry = {
        "name": "qa",
        "blocking": False,
        "resumable": {"receives_messages": "side_a", "parent_communication": "explicit"},
    }
    app, client, tid = await start(app_factory, catalog(brain, entry), worker=False)
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await ran(
        drive, app, client, tid, lambda rs: any("sent the following message" in (r["content"] or "") for r in rs)
    )
    cid = next(r for r in rows if r["role"] == "tool")["subagent_id"]
    note = next(r for r in rows if "sent the following message" in (r["content"] or ""))
    assert (
        note["content"] == f"Subagent (reference: {cid}) sent the following message:\n\nWhich colour? I need an answer."
    )
    assert note["silent"] and note["metadata"]["subagent_id"] == cid
    assert (await client.get(f"/threads/{cid}")).json()["status"] == "idle"  # the child's session ended: nothing
    # runnable is left (`drive` ran it all), so a report of it would be stored by now
    assert not any("has returned the following result" in (r["content"] or "") for r in rows)  # explicit: no report
    assert (await registry(client, tid))[0]["status"] == "asking the parent"


# -- lifecycle ----------------------------------------------------------------------------------------------


async def test_terminating_or_deleting_a_parent_takes_its_children(app_factory: Any) -> None:
    hold = asyncio.Event()
    brain = Brain(delegate(), hold=hold)
    app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}))
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})

    async def child() -> str | None:
        entries = await registry(client, tid)
        return entries[0]["reference"] if entries else None

    cid = await wait_for(child)
    assert (await client.post(f"/threads/{tid}/terminate")).status_code == 200
    assert (await client.get(f"/threads/{cid}")).json()["status"] == "terminated"
    hold.set()
    assert (await client.delete(f"/threads/{tid}")).json()["deleted"] == [cid, tid]
    async with app.state.runtime.sessions() as session:
        left = (await session.execute(select(tables.Thread.id))).scalars().all()
    assert left == []


async def test_stopping_a_waiting_parent_terminates_its_blocking_child(app_factory: Any) -> None:
    hold = asyncio.Event()
    brain = Brain(delegate(), hold=hold)
    _app, client, tid = await start(app_factory, catalog(brain, {"name": "qa"}))
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})

    async def waiting() -> bool:
        return bool((await client.get(f"/threads/{tid}")).json()["status"] == "waiting")

    await wait_for(waiting)
    cid = (await registry(client, tid))[0]["reference"]
    assert (await client.post(f"/threads/{tid}/stop")).status_code == 200
    assert (await client.get(f"/threads/{cid}")).json()["status"] == "terminated"
    tool = next(r for r in await stored(client, tid) if r["role"] == "tool")
    assert tool["content"] == "Execution stopped by user" and tool["tool_status"] == "error"
    hold.set()


async def test_children_and_handles_on_child_and_parent_threads(app_factory: Any) -> None:
    script = [
        {"name": "qa", "arguments": {"message": "check it"}},
        {"name": "inspect_children", "arguments": {}},
    ]
    brain = Brain(manager(script))
    _app, client, tid = await start(app_factory, catalog(brain, {"name": "qa", "blocking": False}))
    await client.post(f"/threads/{tid}/messages", json={"content": "start"})
    rows = await until(client, tid, lambda rs: any(r["name"] == "inspect_children" for r in rs if r["role"] == "tool"))
    result = json.loads(next(r["content"] for r in rows if r["name"] == "inspect_children"))
    assert result["child"][0] == "qa" and result["child"][2] is False
    assert result["child_first_message"] == "check it"
    assert result["childs_parent"] == tid and result["my_parent"] is None


# -- optional and immediate ---------------------------------------------------------------------------------


async def test_optional_subagents_exist_only_when_their_env_says_so(app_factory: Any, drive: Any) -> None:
    brain = Brain(lambda request: "nothing to do")
    app = await app_factory(
        catalog(brain, {"name": "qa", "optional": "USE_QA"}),
    )
    client = client_for(app)
    for value, offered in ((None, False), ("no", False), ("Yes", True), ("1", True)):
        body: dict[str, Any] = {"agent": "boss"}
        if value is not None:
            body["env"] = {"USE_QA": value}
        tid = (await client.post("/threads", json=body)).json()["id"]
        await client.post(f"/threads/{tid}/messages", json={"content": "hello"})
        await ran(drive, app, client, tid, said("nothing to do"))
        assert ("qa" in {t.name for t in brain.seen["boss"][-1].tools}) is offered, value


async def test_immediate_children_start_at_thread_creation_without_the_parent_running(app_factory: Any) -> None:
    hold = asyncio.Event()  # the child's model call waits: it cannot finish and report, which would wake the parent
    brain = Brain(lambda request: "nothing to do", hold=hold)
    _app, client, tid = await start(app_factory, catalog(brain, {"name": "qa", "immediate": True, "blocking": True}))

    async def spawned() -> list[dict[str, Any]] | None:
        entries = await registry(client, tid)
        return entries or None

    [entry] = await wait_for(spawned)
    assert entry["blocking"] is False  # immediate children never block
    first = (await stored(client, entry["reference"]))[0]
    assert first["silent"] and first["role"] == "user"
    assert first["content"] == "You were started automatically by your parent thread.\n\nChecks work."
    await wait_for(lambda: asyncio.sleep(0, "worker" in brain.seen))  # the child runs
    assert "boss" not in brain.seen  # the parent's model was not called
    hold.set()


async def test_immediate_fan_out_gives_each_instance_its_own_scoped_values(app_factory: Any, drive: Any) -> None:
    """Instance k gets its group's values under the plain names, a secret staying secret, and none of the other
    instances' values: no `NAME__k` and no plain `NAME` of instance 1 reach it from the parent (§6.6, §6.7)."""
    seen: dict[str, dict[str, str | None]] = {}

    @define_tool(description="Read the scoped values.")
    async def read_region(state: ThreadState) -> str:
        async def value(name: str) -> str | None:
            try:
                return await state.env(name)
            except LookupError:
                return None

        seen[state.thread_id] = {"REGION": await state.env("REGION"), "TOKEN": await value("TOKEN")}
        await state.write_file("/out/note.txt", "x")
        return "read"

    brain = Brain(lambda request: "nothing to do")
    entry = {
        "name": "qa",
        "immediate": {"scoped_env": ["REGION", "TOKEN"], "name_env": "REGION_NAME"},
        "resumable": {"receives_messages": "side_a", "max_instances": 2},
    }
    scoped = {"name": "REGION", "type": "text", "required": True, "scoped": True}
    cat = catalog(brain, entry, variables=[scoped])
    cat = dataclasses.replace(cat, tools={**cat.tools, "write_note": read_region})
    app = await app_factory(cat)
    client = client_for(app)
    env = {"REGION": "eu", "REGION_NAME": "europe", "TOKEN": "tok-eu", "REGION__2": "us", "REGION_NAME__2": "america",
           "REGION__3": "ap", "TOKEN__3": "tok-ap", "SHARED": "all"}  # fmt: skip
    body = {"agent": "boss", "env": env, "secrets": ["TOKEN", "TOKEN__3"]}
    tid = (await client.post("/threads", json=body)).json()["id"]
    await drive(app)
    entries = await registry(client, tid)
    assert sorted(e["thread_name"] for e in entries) == ["america", "europe"]  # capped at max_instances = 2
    assert entries[0]["spawn_group_id"] is not None and entries[0]["spawn_group_id"] == entries[1]["spawn_group_id"]
    by_name = {e["thread_name"]: e["reference"] for e in entries}
    # instance 2 has no TOKEN__2: it has no TOKEN at all, never instance 1's
    assert seen == {
        by_name["europe"]: {"REGION": "eu", "TOKEN": "tok-eu"},
        by_name["america"]: {"REGION": "us", "TOKEN": None},
    }
    europe = (await client.get(f"/threads/{by_name['europe']}")).json()
    assert europe["env"] == {"REGION": "eu", "SHARED": "all", "TOKEN": None}
    assert europe["env_types"] == {"REGION": "text", "SHARED": "text", "TOKEN": "secret"}
    america = (await client.get(f"/threads/{by_name['america']}")).json()
    assert america["env"] == {"REGION": "us", "SHARED": "all"}


# -- scoped variables and the bootstrap flow ----------------------------------------------------------------


async def test_the_bootstrap_flow_end_to_end(app_factory: Any, drive: Any) -> None:
    brain = Brain(delegate())
    token = {"name": "API_TOKEN", "type": "secret", "required": True, "scoped": True}
    cat = catalog(brain, {"name": "qa"}, variables=[token])
    app = await app_factory(
        cat,
    )
    client = client_for(app)
    # the parent's own thread env never satisfies a scoped variable
    tid = (await client.post("/threads", json={"agent": "boss", "env": {"API_TOKEN": "parent-value"}})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})
    rows = await ran(drive, app, client, tid, said("boss saw"))
    tool = next(r for r in rows if r["role"] == "tool")
    assert tool["tool_status"] == "error" and tool["metadata"]["error_code"] == "subagent_env_required"
    data = tool["metadata"]["error_data"]
    request_id = data["request_id"]
    endpoint = f"/threads/{tid}/variables/{request_id}"
    assert data == {"request_id": request_id, "endpoint": endpoint, "required": ["API_TOKEN"],
                    "missing": ["API_TOKEN"], "agent": "qa"}  # fmt: skip
    assert tool["content"] == (
        'Subagent "qa" requires scoped environment variables before it can be created. Provide the missing values '
        f"via GET/POST /threads/{tid}/variables/{request_id}."
    )
    assert await registry(client, tid) == []  # nothing was created

    got = (await client.get(endpoint)).json()
    assert (got["required"], got["missing"], got["status"], got["agent"]) == (
        ["API_TOKEN"],
        ["API_TOKEN"],
        "pending",
        "qa",
    )
    still = await client.post(endpoint, json={"env": {"OTHER": "x"}})
    assert still.status_code == 400 and still.json()["error"]["details"]["missing"] == ["API_TOKEN"]
    done = await client.post(endpoint, json={"env": {"API_TOKEN": "tok-123"}})
    assert done.status_code == 200, done.text
    cid = done.json()["child_thread_id"]
    assert done.json() == {"request_id": request_id, "child_thread_id": cid, "status": "success"}
    assert (await client.post(endpoint, json={"env": {"API_TOKEN": "again"}})).status_code == 409

    child = (await client.get(f"/threads/{cid}")).json()
    assert child["env"]["API_TOKEN"] is None and child["env_types"]["API_TOKEN"] == "secret"  # stored secret
    rows = await ran(
        drive, app, client, tid, lambda rs: any("has returned the following result" in (r["content"] or "") for r in rs)
    )
    report = next(r for r in rows if "has returned the following result" in (r["content"] or ""))
    assert report["content"].startswith(f"Subagent (reference: {cid}) has returned the following result:\n\nlooks good")
    assert (await client.get(endpoint)).json()["child_thread_id"] == cid
    assert (await client.get(f"/threads/{tid}/variables/{uuid.uuid4()}")).status_code == 404


async def test_the_scoped_check_leaves_out_a_disabled_branch_of_the_childs_graph(app_factory: Any, drive: Any) -> None:
    """A branch of the child's graph whose `optional` flag is off requires nothing; the flag is read in the env the
    child will have — here the copy of the parent's thread env it gets (§6.6, §6.7)."""
    cat = catalog(Brain(delegate()), {"name": "qa"})
    aide = define_prompt(name="aide", model="m", prompt="aide.",
                         variables=[{"name": "TOKEN", "required": True, "scoped": True}])  # fmt: skip
    helper = define_agent(name="helper", type="dual_ai", expose_as_tool=True, tool_description="Helps.",
                          max_session_turns=2, side_a={"prompt": "aide"}, side_b={"prompt": "aide"})  # fmt: skip
    worker = cat.prompts["worker"]
    worker = worker.model_copy(update={"tools": [*worker.tools, ToolEntry(name="helper", optional="USE_HELPER")]})
    cat = dataclasses.replace(
        cat, prompts={**cat.prompts, "aide": aide, "worker": worker}, agents={**cat.agents, "helper": helper}
    )
    app = await app_factory(cat)
    client = client_for(app)
    for env, asked in (({}, False), ({"USE_HELPER": "no"}, False), ({"USE_HELPER": "yes"}, True)):
        tid = (await client.post("/threads", json={"agent": "boss", "env": env})).json()["id"]
        await client.post(f"/threads/{tid}/messages", json={"content": "go"})
        rows = await ran(drive, app, client, tid, said("boss saw"))
        tool = next(r for r in rows if r["role"] == "tool")
        if asked:
            assert tool["metadata"]["error_code"] == "subagent_env_required", tool
            assert tool["metadata"]["error_data"]["missing"] == ["TOKEN"]
        else:
            assert tool["tool_status"] == "success" and tool["content"].startswith("looks good"), (env, tool)


async def test_an_immediate_instance_waiting_for_a_value_keeps_its_own_scoped_values(app_factory: Any) -> None:
    brain = Brain(lambda request: "nothing to do")
    variables = [
        {"name": "REGION", "type": "text", "required": True, "scoped": True},
        {"name": "API_TOKEN", "type": "secret", "required": True, "scoped": True},
    ]
    entry = {"name": "qa", "immediate": {"scoped_env": ["REGION"]}}
    app = await app_factory(catalog(brain, entry, variables=variables), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "boss", "env": {"REGION": "eu"}})).json()["id"]

    async def asked() -> dict[str, Any] | None:
        found = [d for e, d in await event_types(client, tid) if e == "event"]
        return found[0]["data"] if found else None

    data = await wait_for(asked)
    assert data["required"] == ["API_TOKEN", "REGION"] and data["missing"] == ["API_TOKEN"]
    assert await registry(client, tid) == []
    done = await client.post(data["endpoint"], json={"env": {"API_TOKEN": "tok"}})
    assert done.status_code == 200, done.text  # REGION came with the instance: only API_TOKEN was needed
    child = (await client.get(f"/threads/{done.json()['child_thread_id']}")).json()
    assert child["env"]["REGION"] == "eu" and child["env_types"]["API_TOKEN"] == "secret"
    assert child["tags"] == ["name:qa", "immediate:qa:1"]


async def test_children_are_read_only_for_a_thread_that_has_had_one(sessions: async_sessionmaker[AsyncSession]) -> None:
    """The engine reads a thread's children at every step only if it ever had one: any child's insert, whatever
    code makes it, marks its parent (a trigger); `children.create` marks the parent it holds too."""
    agent = define_agent(name="a", side_a={"prompt": "p"})

    async def spawn(s: AsyncSession, parent: tables.Thread) -> tables.Thread:
        return await children.create(
            s,
            parent,
            agent="a",
            agent_type="ai_human",
            owner_side="a",
            title=None,
            description=None,
            resumable=False,
            blocking=True,
            receives_messages=None,
            parent_communication="implicit",
            terminal=False,
        )

    async with sessions() as s, s.begin():
        parent = await threads.create(s, agent, keys.OPEN)
        assert not parent.has_children and await children.listed(s, parent) == []
        child = tables.Thread(id=uuid.uuid4(), agent="a", type="ai_human", parent_id=parent.id, user_id=parent.user_id)
        s.add(child)
        await s.flush()
    async with sessions() as s:
        parent = await threads.lock(s, parent.id)
        assert parent.has_children
        assert [c.id for c in await children.listed(s, parent)] == [child.id]
        second = await spawn(s, parent)
        fresh = await threads.create(s, agent, keys.OPEN)
        third = await spawn(s, fresh)
        assert fresh.has_children and [c.id for c in await children.listed(s, fresh)] == [third.id]
        assert len(await children.listed(s, parent)) == 2 and second.parent_id == parent.id


# -- parallel tool calls --------------------------------------------------------------------------------------


async def test_blocking_children_of_one_answer_run_at_once_in_one_spawn_group(app_factory: Any) -> None:
    """With `parallel_tool_calls`, three blocking subagent calls of one answer start three children together (the
    parent parks once, on all of them); they share a spawn group, and each result answers its own call."""

    def boss(request: LLMRequest) -> Any:
        last = last_of(request)
        if last.role == "user" and last.content == "go":
            return {"tool_calls": [{"name": "qa", "arguments": {"message": f"part {n}"}} for n in (1, 2, 3)]}
        return f"boss saw: {last.content}"

    hold = asyncio.Event()
    cat = catalog(Brain(boss, hold=hold), {"name": "qa"})
    parallel = cat.prompts["boss"].model_copy(update={"parallel_tool_calls": True})
    cat = dataclasses.replace(cat, prompts={**cat.prompts, "boss": parallel})
    _, client, tid = await start(app_factory, cat)
    await client.post(f"/threads/{tid}/messages", json={"content": "go"})

    async def all_started() -> list[dict[str, Any]] | None:
        kids = await registry(client, tid)
        return kids if len(kids) == 3 else None

    kids = await wait_for(all_started)  # all three exist while every one of them is still held at its first step
    assert [k["status"] for k in kids] == ["running"] * 3 and not hold.is_set()
    groups = {k["spawn_group_id"] for k in kids}
    assert len(groups) == 1 and None not in groups
    hold.set()
    rows = await until(client, tid, said("boss saw"))
    planned = next(r for r in rows if r["role"] == "assistant" and r["tool_calls"])["tool_calls"]
    answers = [r for r in rows if r["role"] == "tool"]
    assert sorted(a["tool_call_id"] for a in answers) == sorted(c["id"] for c in planned)  # each once, as they end
    assert {a["subagent_id"] for a in answers} == {k["reference"] for k in kids}
    assert all(a["tool_status"] == "success" for a in answers)
    firsts = {(await stored(client, k["reference"]))[0]["content"] for k in kids}
    assert firsts == {"part 1", "part 2", "part 3"}
