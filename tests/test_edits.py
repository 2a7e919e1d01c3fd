"""`PATCH` / `DELETE /threads/{id}/messages/{message_id}`: the update hooks, the events, what a running step still
writes or uses is refused, and what the engine's next step sees."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from app import messages, threads
from app.catalog import Catalog
from app.spec import (
    LLMMessage,
    StateMessage,
    ThreadState,
    define_agent,
    define_hook,
    define_model,
    define_prompt,
    define_tool,
)
from tests.conftest import client_for
from tests.test_api import _key, assert_error
from tests.test_engine import event_types, stored
from tests.test_hooks import CALL_ADD, Model, catalog, run, settle_after
from tests.tools import add


class Gated:
    """A `respond` function whose `hold`-th call (from 0) waits for `go`; keeps what each request held."""

    def __init__(self, *replies: Any, hold: int) -> None:
        self.replies = list(replies)
        self.requests: list[list[LLMMessage]] = []
        self.hold = hold
        self.started, self.go = asyncio.Event(), asyncio.Event()

    async def __call__(self, request: Any) -> Any:
        self.requests.append(list(request.messages))
        n = len(self.requests) - 1
        if n == self.hold:
            self.started.set()
            await self.go.wait()
        return self.replies[n]

    def contents(self, n: int) -> list[str | None]:
        return [m.content for m in self.requests[n]]


async def test_an_edit_runs_the_update_hooks_outside_the_execution_and_is_announced(app_factory: Any) -> None:
    seen: list[tuple[bool, str | None]] = []

    @define_hook("before_update_message")
    async def mark(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        if state.execution is None:  # a client's edit, not the engine completing its answer
            updates["content"] = f"{updates['content']} (edited)"
            updates["metadata"] = {**updates["metadata"], "edited": True}
        return updates

    @define_hook("after_update_message")
    async def record(state: ThreadState, message: StateMessage) -> None:
        seen.append((state.execution is None, message.content))

    client, tid = await run(app_factory, catalog(Model("hello"), [mark, record]), "hi")
    reply = (await stored(client, tid))[-1]
    assert reply["content"] == "hello"
    response = await client.patch(f"/threads/{tid}/messages/{reply['id']}", json={"content": "bye"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["id"], body["content"], body["metadata"]) == (reply["id"], "bye (edited)", {"edited": True})
    assert (await client.get(f"/threads/{tid}/messages/{reply['id']}")).json()["content"] == "bye (edited)"
    assert seen[-1] == (True, "bye (edited)")
    last_type, last_data = (await event_types(client, tid))[-1]
    assert last_type == "message_data"
    assert (last_data["message_id"], last_data["data"]["content"]) == (reply["id"], "bye (edited)")


async def test_a_failing_update_hook_leaves_the_edit_as_sent_and_its_log_masks_secrets(app_factory: Any) -> None:
    @define_hook("before_update_message")
    async def leak(state: ThreadState, message_id: str, updates: dict[str, Any]) -> dict[str, Any]:
        if state.execution is None:
            raise RuntimeError(f"cannot edit with {await state.env('TOKEN')}")
        return updates

    app = await app_factory(catalog(Model("hello"), [leak]), with_worker=True)
    client = client_for(app)
    created = await client.post(
        "/threads", json={"agent": "agent", "env": {"TOKEN": "tok-s3cret"}, "secrets": ["TOKEN"]}
    )
    tid = created.json()["id"]
    assert (await client.post(f"/threads/{tid}/messages", json={"content": "hi"})).status_code == 202
    await settle_after(client, tid, 1)
    reply = (await stored(client, tid))[-1]
    response = await client.patch(f"/threads/{tid}/messages/{reply['id']}", json={"content": "bye"})
    assert response.status_code == 200 and response.json()["content"] == "bye"
    logs = (await client.get(f"/threads/{tid}/logs", params={"kind": "hook"})).json()["logs"]
    failed = [log for log in logs if log["status"] == "error"]  # its runs inside the execution returned
    assert len(failed) == 1 and "cannot edit with ***" in failed[0]["error"]
    assert {log["status"] for log in logs} == {"success", "error"}
    assert "tok-s3cret" not in str(logs)


async def test_edits_and_deletions_while_running_reach_the_next_step_and_the_pending_answer_is_refused(
    app_factory: Any,
) -> None:
    model = Gated("first answer", CALL_ADD, "done", hold=1)
    client, tid = await run(app_factory, catalog(model, []), "hello")  # type: ignore[arg-type]
    greeting, answer = await stored(client, tid)
    assert (greeting["content"], answer["content"]) == ("hello", "first answer")
    assert (await client.post(f"/threads/{tid}/messages", json={"content": "again"})).status_code == 202
    await asyncio.wait_for(model.started.wait(), 10)
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "running"
    pending = (await stored(client, tid))[-1]
    assert pending["status"] == "pending"
    url = f"/threads/{tid}/messages"
    assert_error(await client.patch(f"{url}/{pending['id']}", json={"content": "x"}), 409, "message_busy")
    assert_error(await client.delete(f"{url}/{pending['id']}"), 409, "message_busy")
    assert (await client.patch(f"{url}/{answer['id']}", json={"content": "edited answer"})).status_code == 200
    assert (await client.delete(f"{url}/{greeting['id']}")).status_code == 204
    model.go.set()
    await settle_after(client, tid, 1)
    assert "hello" in model.contents(1)  # the request already on its way keeps what it was built from
    assert "edited answer" in model.contents(2) and "first answer" not in model.contents(2)
    assert "hello" not in model.contents(2)
    assert [m["content"] for m in await stored(client, tid)][-1] == "done"
    deleted = [d for t, d in await event_types(client, tid) if t == "message_deleted"]
    assert deleted == [{"message_id": greeting["id"], "depth": 0}]


class Hold:
    """A tool that waits for `go` (after setting `started`)."""

    def __init__(self) -> None:
        self.started, self.go = asyncio.Event(), asyncio.Event()


def _holding_catalog(model: Any, gate: Hold) -> Catalog:
    @define_tool(description="Waits.")
    async def wait(state: ThreadState) -> str:
        gate.started.set()
        await gate.go.wait()
        return "waited"

    m = define_model(name="m", provider="test", respond=model)
    p = define_prompt(name="p", model="m", prompt="sys", include_chat=True, include_past_tools=True, tools=["wait"])
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."), models={"m": m}, prompts={"p": p}, agents={"agent": agent}, tools={"wait": wait, "add": add}
    )


async def test_a_tool_call_message_goes_with_its_results_and_not_while_its_calls_run(app_factory: Any) -> None:
    gate = Hold()
    model = Model({"tool_calls": [{"name": "wait", "arguments": {}}]}, "fine", "next")
    app = await app_factory(_holding_catalog(model, gate), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    url = f"/threads/{tid}/messages"
    assert (await client.post(url, json={"content": "go"})).status_code == 202
    await asyncio.wait_for(gate.started.wait(), 10)
    calling = next(m for m in await stored(client, tid) if m["tool_calls"])
    assert_error(await client.delete(f"{url}/{calling['id']}"), 409, "message_busy")  # its result is still to come
    assert (await client.patch(f"{url}/{calling['id']}", json={"content": "let me wait"})).status_code == 200
    gate.go.set()
    await settle_after(client, tid, 1)
    result = next(m for m in await stored(client, tid) if m["role"] == "tool")
    refused = assert_error(await client.delete(f"{url}/{result['id']}"), 409, "tool_result_alone")
    assert calling["id"] in refused["message"] and refused["details"] == {"call_message_id": calling["id"]}
    assert (await client.delete(f"{url}/{calling['id']}")).status_code == 204
    assert [(m["role"], m["content"]) for m in await stored(client, tid)] == [("user", "go"), ("assistant", "fine")]
    deleted = [d["message_id"] for t, d in await event_types(client, tid) if t == "message_deleted"]
    assert deleted == [calling["id"], result["id"]]
    assert_error(await client.get(f"{url}/{result['id']}"), 404, "message_not_found")
    # the next turn's request holds no half of the call: no tool message, no call without its result
    assert (await client.post(url, json={"content": "more"})).status_code == 202
    await settle_after(client, tid, 2)
    assert [(m.role, m.content) for m in model.requests[2]][1:] == [
        ("user", "go"),
        ("assistant", "fine"),
        ("user", "more"),
    ]
    assert not any(m.tool_calls for m in model.requests[2])


async def test_edit_and_delete_errors(app_factory: Any) -> None:
    app: FastAPI = await app_factory(catalog(Model("x"), []))  # no worker: posted input stays queued
    alice, bob = await _key(app, "alice"), await _key(app, "bob")
    async with client_for(app, alice) as a, client_for(app, bob) as b:
        tid = (await a.post("/threads", json={"agent": "agent"})).json()["id"]
        other = (await a.post("/threads", json={"agent": "agent"})).json()["id"]
        async with app.state.runtime.sessions() as session, session.begin():
            row = await messages.add(session, (await threads.lock(session, uuid.UUID(tid))).id, "user", content="hi")
        mid = str(row.id)
        url = f"/threads/{tid}/messages/{mid}"
        assert_error(await b.patch(url, json={"content": "x"}), 404, "thread_not_found")
        assert_error(await b.delete(url), 404, "thread_not_found")
        assert_error(await a.patch(f"/threads/{other}/messages/{mid}", json={"content": "x"}), 404, "message_not_found")
        assert_error(await a.delete(f"/threads/{other}/messages/{mid}"), 404, "message_not_found")
        assert_error(await a.delete(f"/threads/{tid}/messages/{uuid.UUID(int=0)}"), 404, "message_not_found")
        assert_error(await a.patch(url, json={}), 422, "invalid_request")
        assert_error(await a.patch(url, json={"content": "x", "role": "system"}), 422, "invalid_request")
        assert_error(await a.patch(url, json={"content": "a\u0000b"}), 422, "invalid_request")
        queued = (await a.post(f"/threads/{tid}/messages", json={"content": "later"})).json()["message_id"]
        assert_error(await a.patch(f"/threads/{tid}/messages/{queued}", json={"content": "x"}), 409, "message_busy")
        assert_error(await a.delete(f"/threads/{tid}/messages/{queued}"), 409, "message_busy")
        assert (await a.patch(url, json={"content": "hello"})).json()["content"] == "hello"
        assert (await a.post(f"/threads/{tid}/terminate")).status_code == 200
        assert_error(await a.patch(url, json={"content": "x"}), 409, "thread_terminated")
        assert_error(await a.delete(url), 409, "thread_terminated")
