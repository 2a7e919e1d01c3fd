"""dual_ai sessions: turns alternate, each side sees the perspective flip, and every stop rule ends what it should."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from app import catalog
from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool
from tests.conftest import ROOT, client_for
from tests.test_engine import event_types, settle, stored


@define_tool(description="Looks something up.")
async def lookup(state: ThreadState) -> str:
    return "found it"


def dual(
    a: list[Any] | Any,
    b: list[Any] | Any,
    side_a: dict[str, Any] | None = None,
    side_b: dict[str, Any] | None = None,
    **agent: Any,
) -> Catalog:
    """A dual_ai agent whose sides run on their own `test` models (a script, or a `respond` function)."""
    models = {
        name: define_model(name=name, provider="test", **({"script": s} if isinstance(s, list) else {"respond": s}))
        for name, s in (("ma", a), ("mb", b))
    }
    prompts = {
        name: define_prompt(
            name=name,
            model=model,
            prompt=f"You are side {name}.",
            include_chat=True,
            include_past_tools=True,
            tools=["lookup"],
        )
        for name, model in (("pa", "ma"), ("pb", "mb"))
    }
    definition = define_agent(
        name="agent",
        type="dual_ai",
        side_a={"prompt": "pa", **(side_a or {})},
        side_b={"prompt": "pb", **(side_b or {})},
        **agent,
    )
    return Catalog(
        root=Path("."), models=models, prompts=prompts, agents={"agent": definition}, tools={"lookup": lookup}
    )


async def start(
    app_factory: Any, drive: Any, cat: Catalog, content: str = "Begin.", role: str = "user", agent: str = "agent"
) -> tuple[httpx.AsyncClient, str]:
    """A thread of `agent` on an app without a worker, given `content` and run to the end (`drive`)."""
    app = await app_factory(cat)
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": agent})).json()
    await client.post(f"/threads/{thread['id']}/messages", json={"content": content, "role": role})
    await drive(app)
    await settle(client, thread["id"])
    return client, thread["id"]


def shape(rows: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    return [(r["role"], r["side"], r["content"]) for r in rows]


async def test_the_example_agent_writes_until_the_reviewer_approves(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.engine.run")
    client, tid = await start(
        app_factory, drive, catalog.load(ROOT / "agents"), "Write a haiku about the harbour", agent="haiku_review"
    )
    rows = await stored(client, tid)
    poem = "Over the harbour, light\nfolds into the waiting hush\none breath, then the tide"
    assert shape(rows) == [
        ("user", "b", "Write a haiku about the harbour"),
        ("assistant", "a", "Over the harbour, light\nfolds into the waiting hush"),
        ("user", "b", "The draft has 2 line(s); a haiku needs three lines. Please revise."),
        ("assistant", "a", poem),
        ("user", "b", None),
        ("tool", "b", poem),
    ]
    assert rows[4]["tool_calls"][0]["function"]["name"] == "approve"
    session = (await client.get(f"/threads/{tid}")).json()["session"]
    assert session["status"] == "success" and session["reason"] == "session_stop" and session["turns"] == 3
    assert session["result"] == {"content": poem, "attachments": []}
    names = [e for e, _ in await event_types(client, tid)]
    assert names.count("turn_ended") == 3 and names[-2:] == ["session_ended", "thread_status"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("turn ended:")]
    said = [(line.split(" side=")[1][0], line.split(" outcome=")[1]) for line in lines]  # one per turn, each side's
    assert said == [*[(s, "stop_on_response") for s in "aba"], ("b", "session_stop session=success")]
    assert all(" steps=1 requests=1 " in line for line in lines)


async def test_the_example_reviewer_fails_an_impossible_task(app_factory: Any, drive: Any) -> None:
    client, tid = await start(
        app_factory, drive, catalog.load(ROOT / "agents"), "Write a haiku about impossible", agent="haiku_review"
    )
    session = (await client.get(f"/threads/{tid}")).json()["session"]
    assert session["status"] == "failure" and session["reason"] == "session_fail"
    assert session["result"]["content"] == "The topic cannot be written about."


async def test_each_side_sees_its_own_messages_as_assistant_and_not_the_other_sides_tools(
    app_factory: Any, drive: Any
) -> None:
    seen: dict[str, list[list[tuple[str, str | None, bool]]]] = {"a": [], "b": []}

    def recorder(side: str, replies: list[Any]) -> Any:
        def respond(request: LLMRequest) -> Any:
            seen[side].append([(m.role, m.content, bool(m.tool_calls)) for m in request.messages[1:]])
            return replies[len(seen[side]) - 1]

        return respond

    a = recorder("a", [{"tool_calls": [{"name": "lookup"}]}, "draft one", "draft two"])
    b = recorder("b", ["feedback one"])
    client, tid = await start(app_factory, drive, dual(a, b, max_session_turns=3), "Task.")
    assert seen["a"][0] == [("user", "Task.", False)]
    # side B: the task it (as side B's seat) wrote is its own; A's tool traffic is left out
    assert seen["b"][0] == [("assistant", "Task.", False), ("user", "draft one", False)]
    assert seen["a"][2] == [
        ("user", "Task.", False),
        ("assistant", None, True),
        ("tool", "found it", False),
        ("assistant", "draft one", False),
        ("user", "feedback one", False),
    ]
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["status"] == "success" and thread["session"]["reason"] == "max_session_turns"
    assert thread["session"]["turns"] == 3
    assert [(r["role"], r["side"]) for r in await stored(client, tid)] == [
        ("user", "b"),
        ("assistant", "a"),
        ("tool", "a"),
        ("assistant", "a"),
        ("user", "b"),
        ("assistant", "a"),
    ]
    turns = [d for e, d in await event_types(client, tid) if e == "turn_ended"]
    assert [t["side"] for t in turns] == ["a", "b", "a"]


async def test_session_stop_in_string_form_uses_the_result_text(app_factory: Any, drive: Any) -> None:
    b = [{"tool_calls": [{"name": "done"}]}]
    client, tid = await start(app_factory, drive, dual(["draft"], b, side_b={"session_stop": "done"}))
    rows = await stored(client, tid)
    assert shape(rows)[-1] == ("tool", "b", "ok")
    session = (await client.get(f"/threads/{tid}")).json()["session"]
    assert session["result"] == {"content": "ok", "attachments": []} and session["reason"] == "session_stop"


async def test_session_fail_in_object_form_maps_message_and_attachments(app_factory: Any, drive: Any) -> None:
    call = {"name": "give_up", "arguments": {"why": "no data", "files": "/attachments/log.txt"}}
    binding = {"name": "give_up", "message_property": "why", "attachments_property": "files"}
    app = await app_factory(dual([{"tool_calls": [call]}], [], side_a={"session_fail": binding}))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    put = await client.put(
        f"/threads/{tid}/fs/attachments/log.txt", content=b"trace", headers={"content-type": "text/plain"}
    )
    assert put.status_code == 201
    await client.post(f"/threads/{tid}/messages", json={"content": "Begin."})
    await drive(app)
    await settle(client, tid)
    tool = (await stored(client, tid))[-1]
    ref = {"path": "/attachments/log.txt", "name": "log.txt", "mime_type": "text/plain", "size": 5}
    assert (tool["content"], tool["attachments"]) == ("no data", [ref])
    session = (await client.get(f"/threads/{tid}")).json()["session"]
    assert session["status"] == "failure" and session["reason"] == "session_fail"
    assert session["result"] == {"content": "no data", "attachments": ["/attachments/log.txt"]}


async def test_session_fail_wins_over_session_stop_in_one_step(app_factory: Any, drive: Any) -> None:
    calls = {"tool_calls": [{"name": "finish"}, {"name": "abort"}]}
    sides = {"session_stop": "finish", "session_fail": "abort"}
    client, tid = await start(app_factory, drive, dual([calls], [], side_a=sides))
    assert (await client.get(f"/threads/{tid}")).json()["session"]["reason"] == "session_fail"


async def test_a_failed_session_tool_call_ends_nothing(app_factory: Any, drive: Any) -> None:
    bad = {"tool_calls": [{"name": "finish", "arguments": {"unexpected": 1}}]}
    binding = {"name": "finish", "message_property": "summary"}
    client, tid = await start(
        app_factory, drive, dual([bad, "fine, a draft"], ["ok"], side_a={"session_stop": binding}, max_session_turns=2)
    )
    rows = await stored(client, tid)
    assert rows[2]["role"] == "tool" and rows[2]["tool_status"] == "error"
    assert shape(rows)[3:] == [("assistant", "a", "fine, a draft"), ("user", "b", "ok")]
    assert (await client.get(f"/threads/{tid}")).json()["session"]["reason"] == "max_session_turns"


async def test_a_session_tool_naming_missing_attachments_is_an_error_with_the_contracts_text(
    app_factory: Any, drive: Any
) -> None:
    call = {"name": "finish", "arguments": {"summary": "done", "files": ["/attachments/none.txt", "/x.txt"]}}
    binding = {"name": "finish", "message_property": "summary", "attachments_property": "files"}
    client, tid = await start(
        app_factory,
        drive,
        dual([{"tool_calls": [call]}, "fine"], ["ok"], side_a={"session_stop": binding}, max_session_turns=2),
    )
    tool = next(r for r in await stored(client, tid) if r["role"] == "tool")
    assert tool["tool_status"] == "error"
    assert tool["content"] == (
        "Provided attachment path(s) not found in this thread: /attachments/none.txt, /x.txt. "
        "Use an exact /attachments/... path that exists in this thread, then try again."
    )
    assert (await client.get(f"/threads/{tid}")).json()["session"]["reason"] == "max_session_turns"


async def test_deprecated_aliases_and_session_status(app_factory: Any, drive: Any) -> None:
    a = [
        {"tool_calls": [{"name": "progress", "arguments": {"note": "half way"}}]},
        {"tool_calls": [{"name": "wrap_up"}]},
    ]
    sides = {"endSessionTool": "wrap_up", "statusTool": {"name": "progress", "messageProperty": "note"}}
    client, tid = await start(app_factory, drive, dual(a, [], side_a=sides))
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["status_text"] == "half way"
    assert thread["session"]["reason"] == "session_stop"
    statuses = [d for e, d in await event_types(client, tid) if e == "thread_status" and "status_text" in d]
    assert statuses == [{"status": "running", "status_text": "half way"}]


async def test_stop_tool_max_steps_and_new_sessions(app_factory: Any, drive: Any) -> None:
    a = [
        {"text": "ignored", "tool_calls": [{"name": "hand_over", "arguments": {"text": "over to you"}}]},
        "third turn",
        "second session",
    ]
    b = [{"tool_calls": [{"name": "lookup"}]}, {"tool_calls": [{"name": "lookup"}]}, "unused"]
    cat = dual(
        a,
        b,
        side_a={"stop_tool": "hand_over", "stop_tool_response_property": "text"},
        side_b={"max_steps": 2},
        max_session_turns=3,
    )
    cat = dataclasses.replace(cat, tools={**cat.tools, "hand_over": define_tool(description="Hand over.")(_hand_over)})
    cat.prompts["pa"].tools.append("hand_over")
    client, tid = await start(app_factory, drive, cat)
    reasons = [d["reason"] for e, d in await event_types(client, tid) if e == "turn_ended"]
    assert reasons == ["stop_tool", "max_steps", "stop_on_response"]
    rows = await stored(client, tid)
    assert rows[1]["content"] == "over to you"
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["session"]["number"] == 1 and thread["session"]["reason"] == "max_session_turns"

    await client.post(f"/threads/{tid}/messages", json={"content": "again"})
    await drive(client._transport.app)  # type: ignore[attr-defined]
    thread = await settle(client, tid)
    # counters restart: A answers, B answers, then A's script is exhausted and the session fails
    assert thread["session"]["number"] == 2 and thread["session"]["turns"] == 2
    assert thread["session"]["reason"] == "llm_error"
    assert [r["content"] for r in await stored(client, tid)][-3:-1] == ["second session", "unused"]


class _HandOverArgs(BaseModel):
    text: str


async def _hand_over(state: ThreadState, args: _HandOverArgs) -> str:
    return "handed over"


async def test_the_role_of_input_picks_the_side_that_acts(app_factory: Any, drive: Any) -> None:
    client, tid = await start(
        app_factory, drive, dual([], ["side b answers"], max_session_turns=1), "from A's seat", "assistant"
    )
    assert shape(await stored(client, tid)) == [("assistant", "a", "from A's seat"), ("user", "b", "side b answers")]

    app = await app_factory(dual([], []))
    other = client_for(app)
    thread = (await other.post("/threads", json={"agent": "agent"})).json()
    await other.post(f"/threads/{thread['id']}/messages", json={"content": "note", "role": "system"})
    await drive(app)
    await settle_quietly(other, thread["id"])


async def settle_quietly(client: httpx.AsyncClient, tid: str) -> None:
    """A system message is stored and starts nothing."""
    for _ in range(40):
        thread = (await client.get(f"/threads/{tid}")).json()
        if thread["status"] == "idle" and (await stored(client, tid)):
            break
        await asyncio.sleep(0.05)
    assert thread["status"] == "idle" and thread["session"]["number"] == 0
    assert shape(await stored(client, tid)) == [("system", None, "note")]
