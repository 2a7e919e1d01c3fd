"""Hooks (`semantics.md` §10): each runs at its point and its return value takes effect; failures change nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app import tables
from app.catalog import Catalog
from app.spec import (
    HookDefinition,
    LLMMessage,
    StateMessage,
    ThreadState,
    ToolResult,
    define_agent,
    define_hook,
    define_model,
    define_prompt,
    define_tool,
)
from tests.conftest import client_for, wait_for
from tests.test_engine import stored
from tests.tools import add


@define_tool(description="Always fails.")
async def explode(state: ThreadState) -> str:
    raise RuntimeError("kaboom")


class Model:
    """A `respond` function: replies in order, and keeps what each request held."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.requests: list[list[LLMMessage]] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(list(request.messages))
        return self.replies[len(self.requests) - 1]

    def seen(self, n: int) -> list[tuple[str, str | None]]:
        return [(m.role, m.content) for m in self.requests[n]]


def catalog(
    model: Model,
    hooks: list[HookDefinition],
    *,
    prompt_hooks: list[str] | None = None,
    agent_hooks: list[str] | None = None,
    side: dict[str, Any] | None = None,
) -> Catalog:
    """One `ai_human` agent; its hooks are the ones given unless the prompt or the agent lists others."""
    ids = [h.name for h in hooks]
    m = define_model(name="m", provider="test", respond=model)
    p = define_prompt(
        name="p",
        model="m",
        prompt="sys",
        include_chat=True,
        include_past_tools=True,
        tools=["add", "explode"],
        hooks=prompt_hooks,
    )
    agent_ids = agent_hooks if agent_hooks is not None else (ids if prompt_hooks is None else None)
    agent = define_agent(name="agent", side_a={"prompt": "p", **(side or {})}, hooks=agent_ids)
    return Catalog(
        root=Path("."),
        models={"m": m},
        prompts={"p": p},
        agents={"agent": agent},
        tools={"add": add, "explode": explode},
        hooks={h.name: h for h in hooks},
    )


async def run(app_factory: Any, cat: Catalog, *texts: str) -> tuple[Any, str]:
    """Post each text as its own turn and wait for the thread to settle after it (a worker runs it)."""
    app = await app_factory(cat, with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    for n, text in enumerate(texts, 1):
        assert (await client.post(f"/threads/{tid}/messages", json={"content": text})).status_code == 202
        await settle_after(client, tid, n)
    return client, tid


async def settle_after(client: Any, tid: str, users: int) -> None:
    """Wait until the thread is idle with `users` user messages delivered."""

    async def done() -> bool:
        thread = (await client.get(f"/threads/{tid}")).json()
        delivered = [m for m in await stored(client, tid) if m["role"] == "user"]
        return thread["status"] == "idle" and len(delivered) >= users

    await wait_for(done)


async def driven(app_factory: Any, drive: Any, cat: Catalog, *texts: str) -> tuple[Any, str]:
    """`run` without a worker: each turn runs to its end in the test's task (`drive`)."""
    app = await app_factory(cat)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    for text in texts:
        assert (await client.post(f"/threads/{tid}/messages", json={"content": text})).status_code == 202
        await drive(app)
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "idle"
    return client, tid


CALL_ADD = {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}


async def test_filter_messages_shapes_the_assembled_history(app_factory: Any, drive: Any) -> None:
    @define_hook("filter_messages")
    async def forget_one(state: ThreadState, messages: list[StateMessage]) -> list[StateMessage]:
        assert state.execution is not None and state.execution.side == "a"
        kept = [m for m in messages if m.content != "one"]
        for m in kept:
            m.content = (m.content or "").upper()
        note = {"id": "note", "role": "system", "side": None, "content": "note", "status": "completed"}
        return [*kept, StateMessage.model_validate({**note, "created_at": datetime.now(UTC)})]

    model = Model("reply 1", "reply 2")
    client, tid = await driven(app_factory, drive, catalog(model, [forget_one]), "one", "two")
    assert model.seen(0) == [("system", "sys"), ("system", "note")]
    assert model.seen(1) == [("system", "sys"), ("assistant", "REPLY 1"), ("user", "TWO"), ("system", "note")]
    assert [m["content"] for m in await stored(client, tid)] == ["one", "reply 1", "two", "reply 2"]


async def test_prefilter_llm_history_is_what_the_model_gets(app_factory: Any, drive: Any) -> None:
    @define_hook("prefilter_llm_history")
    async def patch(state: ThreadState, messages: list[LLMMessage]) -> list[LLMMessage]:
        assert messages[0].role == "system"
        return [LLMMessage("system", "patched"), *messages[1:], LLMMessage("user", "extra")]

    model = Model("ok")
    client, tid = await driven(app_factory, drive, catalog(model, [patch]), "hi")
    assert model.seen(0) == [("system", "patched"), ("user", "hi"), ("user", "extra")]
    assert [m["content"] for m in await stored(client, tid)] == ["hi", "ok"]


async def test_before_create_message_edits_every_created_message(app_factory: Any, drive: Any) -> None:
    @define_hook("before_create_message")
    async def tag(state: ThreadState, message: dict[str, Any]) -> dict[str, Any]:
        message["metadata"] = {**message["metadata"], "created_as": message["role"]}
        if message["role"] == "user":
            message["content"] += " (checked)"
        message["role"] = "system"  # not an editable field: ignored
        return message

    model = Model(CALL_ADD, "It is 5.")
    client, tid = await driven(app_factory, drive, catalog(model, [tag]), "2+3?")
    rows = await stored(client, tid)
    assert [(m["role"], m["metadata"]) for m in rows] == [
        ("user", {"created_as": "user"}),
        ("assistant", {"created_as": "assistant"}),
        ("tool", {"created_as": "tool"}),
        ("assistant", {"created_as": "assistant"}),
    ]
    assert rows[0]["content"] == "2+3? (checked)"
    assert model.seen(0)[-1] == ("user", "2+3? (checked)")


async def test_after_create_message_sees_the_stored_message(app_factory: Any, drive: Any) -> None:
    created: list[tuple[str, str, bool]] = []

    @define_hook("after_create_message")
    async def record(state: ThreadState, message: StateMessage) -> None:
        # runs inside the creating transaction: the state reads through it, so the message is already there
        listed = await state.get_messages(include_silent=True)
        created.append((message.id, message.role, any(m.id == message.id for m in listed.messages)))

    model = Model(CALL_ADD, "It is 5.")
    client, tid = await driven(app_factory, drive, catalog(model, [record]), "2+3?")
    rows = await stored(client, tid)
    assert created == [(m["id"], m["role"], True) for m in rows]


@define_tool(description="Injects a note.")
async def inject_note(state: ThreadState) -> str:
    return (await state.inject_message("user", "injected", metadata={"via": "tool"})).content or ""


async def test_an_injected_message_runs_the_create_hooks(app_factory: Any, drive: Any) -> None:
    """`state.inject_message` inserts a message: the hooks table's `before_create_message` and
    `after_create_message` run for it as for any other; what a create hook injects itself runs none (no loop)."""
    created: list[tuple[str | None, dict[str, Any]]] = []

    @define_hook("before_create_message")
    async def tag(state: ThreadState, message: dict[str, Any]) -> dict[str, Any]:
        message["metadata"] = {**message["metadata"], "tagged": True}
        if message["content"] == "injected":
            message["content"] += " (checked)"
        return message

    @define_hook("after_create_message")
    async def echo(state: ThreadState, message: StateMessage) -> None:
        created.append((message.content, message.metadata))
        if message.metadata.get("via") == "tool":
            await state.inject_message("system", "echo of the injection")

    cat = catalog(Model({"tool_calls": [{"name": "inject_note"}]}, "ok"), [tag, echo])
    cat = dataclasses.replace(cat, tools={**cat.tools, "inject_note": inject_note})
    cat.prompts["p"].tools.append("inject_note")
    client, tid = await driven(app_factory, drive, cat, "go")
    rows = await stored(client, tid)
    assert [(m["role"], m["content"], m["metadata"]) for m in rows] == [
        ("user", "go", {"tagged": True}),
        ("assistant", None, {"tagged": True}),
        ("user", "injected (checked)", {"via": "tool", "tagged": True}),
        ("system", "echo of the injection", {}),  # injected by a create hook: no hooks, no recursion
        ("tool", "injected (checked)", {"tagged": True}),
        ("assistant", "ok", {"tagged": True}),
    ]
    assert ("injected (checked)", {"via": "tool", "tagged": True}) in created
    assert ("echo of the injection", {}) not in created


async def test_before_update_message_edits_the_completed_message(app_factory: Any, drive: Any) -> None:
    updates_seen: list[dict[str, Any]] = []

    @define_hook("before_update_message")
    async def shout(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        updates_seen.append({"id": message_id, **updates})
        updates["content"] = (updates["content"] or "").upper()
        updates["metadata"] = {"shouted": True}
        updates["status"] = "failed"  # not editable: the engine's status stays
        return updates

    model = Model("it is 5.")
    client, tid = await driven(app_factory, drive, catalog(model, [shout]), "2+3?")
    reply = (await stored(client, tid))[-1]
    assert (reply["content"], reply["metadata"], reply["status"]) == ("IT IS 5.", {"shouted": True}, "completed")
    assert [(u["id"], u["status"], u["content"]) for u in updates_seen] == [(reply["id"], "completed", "it is 5.")]


async def test_after_update_message_sees_the_updated_message(app_factory: Any, drive: Any) -> None:
    updated: list[tuple[str, str | None, str | None]] = []

    @define_hook("after_update_message")
    async def record(state: ThreadState, message: StateMessage) -> None:
        listed = await state.get_messages()
        now = next(m for m in listed.messages if m.id == message.id)
        updated.append((message.status, message.content, now.content))

    model = Model("done")
    await driven(app_factory, drive, catalog(model, [record]), "go")
    assert updated == [("completed", "done", "done")]


@define_tool(description="Renames the first message, then tags it.")
async def rename_first(state: ThreadState) -> str:
    first = (await state.get_messages(limit=1)).messages[0]
    await state.update_message(first.id, content="renamed")
    return (await state.update_message(first.id, metadata={"by": "tool"})).content or ""


async def test_state_update_message_runs_the_update_hooks(app_factory: Any, drive: Any) -> None:
    """`state.update_message` changes a stored message as the engine's own updates do: through
    `before_update_message` (its edits are what is stored) and `after_update_message`; what an update hook updates
    itself runs none (no loop)."""
    seen: list[tuple[str, Any, Any]] = []

    @define_hook("before_update_message")
    async def shout(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        seen.append(("before", updates["content"], updates["metadata"]))
        updates["content"] = (updates["content"] or "").upper()
        return updates

    @define_hook("after_update_message")
    async def note(state: ThreadState, message: StateMessage) -> None:
        seen.append(("after", message.content, message.metadata))
        if message.metadata.get("by") == "tool":
            await state.update_message(message.id, metadata={"by": "tool", "noted": True})

    cat = catalog(Model({"tool_calls": [{"name": "rename_first"}]}, "ok"), [shout, note])
    cat = dataclasses.replace(cat, tools={**cat.tools, "rename_first": rename_first})
    cat.prompts["p"].tools.append("rename_first")
    client, tid = await driven(app_factory, drive, cat, "go")
    rows = await stored(client, tid)
    assert (rows[0]["content"], rows[0]["metadata"]) == ("RENAMED", {"by": "tool", "noted": True})
    assert next(m["content"] for m in rows if m["role"] == "tool") == "RENAMED"
    mine = [s for s in seen if s[1] and s[1].lower() == "renamed"]
    assert mine == [
        ("before", "renamed", {}),
        ("after", "RENAMED", {}),
        ("before", "RENAMED", {"by": "tool"}),
        ("after", "RENAMED", {"by": "tool"}),  # its update of the message runs no hooks
    ]


async def test_before_store_tool_result_is_what_gets_stored(app_factory: Any, drive: Any) -> None:
    @define_hook("before_store_tool_result")
    async def redact(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        assert tool_call["function"]["name"] == "add" and result.result == "5"
        return ToolResult(status="success", result="[redacted]")

    model = Model(CALL_ADD, "ok")
    client, tid = await driven(app_factory, drive, catalog(model, [redact]), "2+3?")
    tool = next(m for m in await stored(client, tid) if m["role"] == "tool")
    assert (tool["content"], tool["tool_status"]) == ("[redacted]", "success")
    assert ("tool", "[redacted]") in model.seen(1)


async def test_after_tool_call_hooks_run_by_status_before_the_store_hook(app_factory: Any, drive: Any) -> None:
    @define_hook("after_tool_call_success")
    async def on_success(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        return ToolResult(status="success", result=f"{result.result} +success")

    @define_hook("after_tool_call_failure")
    async def on_failure(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        assert result.error == "Tool `explode` failed: RuntimeError: kaboom"
        return ToolResult(status="success", result="recovered")

    @define_hook("before_store_tool_result")
    async def stamp(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        return ToolResult(status=result.status, result=f"{result.result} +stored")

    calls = {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "explode"}]}
    model = Model(calls, "ok")
    client, tid = await driven(app_factory, drive, catalog(model, [on_success, on_failure, stamp]), "go")
    tools = [(m["content"], m["tool_status"]) for m in await stored(client, tid) if m["role"] == "tool"]
    assert tools == [("5 +success +stored", "success"), ("recovered +stored", "success")]


async def test_a_tool_calls_log_row_holds_the_result_as_stored(app_factory: Any, drive: Any) -> None:
    """What the hooks made of the result, with the message holding it (every path logs so: subagent calls and a
    subprompt's calls too, `test_subagents`, `test_subprompts`); a dropped call's row has the result as returned."""

    @define_hook("after_tool_call_success")
    async def refuse(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult | None:
        if tool_call["function"]["arguments"] == '{"a": 1, "b": 1}':
            return None
        return ToolResult(status="error", error=f"refused: {result.result}")

    calls = {
        "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "add", "arguments": {"a": 1, "b": 1}}]
    }
    client, tid = await driven(app_factory, drive, catalog(Model(calls, "ok"), [refuse]), "go")
    [tool] = [m for m in await stored(client, tid) if m["role"] == "tool"]
    assert (tool["content"], tool["tool_status"]) == ("refused: 5", "error")
    logged = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]
    assert [(r["status"], r["error"], r["message_id"]) for r in logged] == [
        ("error", "refused: 5", tool["id"]),
        ("success", None, None),
    ]


async def test_none_from_after_tool_call_success_drops_the_call_and_its_result(app_factory: Any, drive: Any) -> None:
    @define_hook("after_tool_call_success")
    async def forget(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult | None:
        return None

    calls = {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "explode"}]}
    model = Model(calls, "ok")
    client, tid = await driven(app_factory, drive, catalog(model, [forget]), "go")
    rows = await stored(client, tid)
    assert [m["role"] for m in rows] == ["user", "assistant", "tool", "assistant"]
    assert [c["function"]["name"] for c in rows[1]["tool_calls"]] == ["explode"]
    assert rows[2]["tool_call_id"] == rows[1]["tool_calls"][0]["id"] and rows[2]["tool_status"] == "error"
    sent = model.requests[1]
    assert [c["function"]["name"] for m in sent for c in m.tool_calls or []] == ["explode"]
    assert [m.tool_call_id for m in sent if m.role == "tool"] == [rows[2]["tool_call_id"]]


async def test_stop_rules_still_see_a_dropped_call(app_factory: Any, drive: Any) -> None:
    @define_hook("after_tool_call_success")
    async def forget(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult | None:
        return None

    done = {"tool_calls": [{"name": "finish", "arguments": {"summary": "all good"}}]}
    side = {"session_stop": {"name": "finish", "message_property": "summary"}, "stop_on_response": False}
    model = Model(done)
    client, tid = await driven(app_factory, drive, catalog(model, [forget], side=side), "do it")
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["session"]["reason"], thread["session"]["result"]) == (
        "session_stop",
        {"content": "all good", "attachments": []},
    )
    rows = await stored(client, tid)
    assert [m["role"] for m in rows] == ["user", "assistant"] and rows[1]["tool_calls"] is None


def _suffix(tag: str, name: str) -> HookDefinition:
    async def append(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        updates["content"] = f"{updates['content']}-{tag}"
        return updates

    append.__name__ = name
    return define_hook("before_update_message")(append)


async def test_prompt_hooks_replace_the_agents_and_run_in_order(app_factory: Any, drive: Any) -> None:
    hooks = [_suffix("agent", "agent_hook"), _suffix("one", "first"), _suffix("two", "second")]
    model = Model("x")
    cat = catalog(model, hooks, prompt_hooks=["first", "second"], agent_hooks=["agent_hook"])
    client, tid = await driven(app_factory, drive, cat, "go")
    assert (await stored(client, tid))[-1]["content"] == "x-one-two"


async def test_an_empty_prompt_hooks_list_turns_the_agents_off(app_factory: Any, drive: Any) -> None:
    model = Model("x")
    cat = catalog(model, [_suffix("agent", "agent_hook")], prompt_hooks=[], agent_hooks=["agent_hook"])
    client, tid = await driven(app_factory, drive, cat, "go")
    assert (await stored(client, tid))[-1]["content"] == "x"


async def test_a_failing_hook_is_logged_and_changes_nothing(app_factory: Any, drive: Any) -> None:
    @define_hook("filter_messages")
    async def broken(state: ThreadState, messages: list[StateMessage]) -> list[StateMessage]:
        messages.clear()  # its input is a copy: this changes nothing either
        raise ValueError("boom")

    @define_hook("before_update_message")
    async def wrong_type(state: ThreadState, message_id: str, updates: dict[str, Any]) -> Any:
        return {"content": 42}

    @define_hook("before_update_message")
    async def fine(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        return {**updates, "content": f"{updates['content']}!"}

    model = Model("reply")
    client, tid = await driven(app_factory, drive, catalog(model, [broken, wrong_type, fine]), "hi")
    assert model.seen(0) == [("system", "sys"), ("user", "hi")]
    assert (await stored(client, tid))[-1]["content"] == "reply!"
    app: Any = client._transport.app
    async with app.state.runtime.sessions() as session:
        query = select(tables.Log).where(tables.Log.thread_id == uuid.UUID(tid), tables.Log.kind == "hook")
        logs = list((await session.execute(query.order_by(tables.Log.created_at))).scalars())
    assert sorted((log.status, log.request["id"]) for log in logs if log.request) == [
        ("error", "broken"),
        ("error", "wrong_type"),
        ("success", "fine"),  # the one that returned, with its time
    ]
    failed = {log.tool: log for log in logs if log.status == "error"}
    assert failed["broken"].error == "filter_messages hook `broken` failed: ValueError: boom"
    assert "`content` must be str or NoneType" in (failed["wrong_type"].error or "")


async def test_hooks_that_return_leave_a_row_with_their_time(app_factory: Any, drive: Any) -> None:
    """Wherever they run: inside a transaction (the user's message, the answer's), between a step's transactions
    (a tool result's hooks, written with its row) or after a commit (a tool message's `after_create_message`)."""

    @define_hook("before_store_tool_result")
    async def slow(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        await asyncio.sleep(0.03)
        return result

    @define_hook("after_create_message")
    async def seen(state: ThreadState, message: StateMessage) -> None:
        return None

    client, tid = await driven(app_factory, drive, catalog(Model(CALL_ADD, "ok"), [slow, seen]), "2+3?")
    logs = (await client.get(f"/threads/{tid}/logs", params={"kind": "hook"})).json()["logs"]
    ran = [(log["request"]["hook"], log["tool"], log["status"]) for log in logs]
    assert sorted(ran) == [("after_create_message", "seen", "success")] * 4 + [
        ("before_store_tool_result", "slow", "success")
    ]  # the user's message, the call, its result, the answer
    assert all(log["latency_ms"] is not None and log["error"] is None for log in logs)
    assert next(log for log in logs if log["tool"] == "slow")["latency_ms"] >= 30


def test_define_hook_refuses_unknown_names_and_wrong_parameters() -> None:
    with pytest.raises(TypeError, match="unknown hook `filter_message`: use one of filter_messages, "):
        define_hook("filter_message")

    def plain(state: Any, messages: Any) -> Any:
        return messages

    assert inspect.iscoroutinefunction(define_hook("filter_messages")(plain).fn)  # a plain def runs in a thread

    async def one_arg(state: Any) -> None:
        return None

    with pytest.raises(TypeError, match=r"hook `one_arg` must take \(state, tool_call, result\)"):
        define_hook("after_tool_call_success")(one_arg)


async def test_a_session_tools_stored_result_goes_through_the_tool_hooks(app_factory: Any, drive: Any) -> None:
    """A session tool bound in object form stores its mapped payload: the tool hooks see that payload and what they
    return is what is stored (before, their output was thrown away for such a tool)."""
    seen: list[str | None] = []

    @define_hook("after_tool_call_success")
    async def note(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        seen.append(result.result)
        return ToolResult(status="success", result=f"{result.result} (noted)")

    @define_hook("before_store_tool_result")
    async def stamp(state: ThreadState, tool_call: dict[str, Any], result: ToolResult) -> ToolResult:
        return ToolResult(status="success", result=f"{result.result} (stored)")

    done = {"tool_calls": [{"name": "finish", "arguments": {"summary": "all good"}}]}
    side = {"session_stop": {"name": "finish", "message_property": "summary"}, "stop_on_response": False}
    client, tid = await driven(app_factory, drive, catalog(Model(done), [note, stamp], side=side), "do it")
    assert seen == ["all good"]
    tool = next(m for m in await stored(client, tid) if m["role"] == "tool")
    assert tool["content"] == "all good (noted) (stored)"
    session = (await client.get(f"/threads/{tid}")).json()["session"]  # the session's result is the call's own
    assert (session["reason"], session["result"]) == ("session_stop", {"content": "all good", "attachments": []})
