"""Handoffs (§7.3): an `ai_human` agent in an `ai_human` prompt's tools hands the thread over, in the same run."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from app import errors, events
from app.catalog import Catalog
from app.engine.state import outside
from app.llm.base import LLMRequest
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for, wait_for


class Recorder:
    """A `test` model's `respond`: answers with `replies` in order (then `done`) and keeps every request."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)
        self.requests: list[LLMRequest] = []

    def __call__(self, request: LLMRequest) -> Any:
        self.requests.append(request)
        n = len(self.requests)
        return self.replies[n - 1] if n <= len(self.replies) else "done"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def catalog(front: Recorder, desk: Recorder, billing: Recorder, **front_side: Any) -> Catalog:
    models = {
        name: define_model(name=name, provider="test", respond=respond)
        for name, respond in (("m_front", front), ("m_desk", desk), ("m_billing", billing))
    }
    common = {"include_chat": True, "include_past_tools": True}
    prompts = {
        "front": define_prompt(name="front", model="m_front", prompt="You onboard.", tools=["scheduler"], **common),
        "desk": define_prompt(name="desk", model="m_desk", prompt="You schedule.", tools=["billing"], **common),
        "bills": define_prompt(name="bills", model="m_billing", prompt="You bill.", **common),
    }
    agents = {
        "onboarding": define_agent(name="onboarding", side_a={"prompt": "front", **front_side}),
        "scheduler": define_agent(
            name="scheduler", side_a={"prompt": "desk"}, expose_as_tool=True, tool_description="Books meetings."
        ),
        "billing": define_agent(
            name="billing", side_a={"prompt": "bills"}, expose_as_tool=True, tool_description="Handles invoices."
        ),
    }
    return Catalog(root=Path("."), models=models, prompts=prompts, agents=agents, tools={})


async def start(app_factory: Any, cat: Catalog) -> tuple[FastAPI, httpx.AsyncClient, str]:
    app: FastAPI = await app_factory(cat, with_worker=True)
    client = client_for(app)
    created = await client.post("/threads", json={"agent": "onboarding"})
    assert created.status_code == 201, created.text
    assert created.json()["origin_agent"] is None
    return app, client, created.json()["id"]


async def say(client: httpx.AsyncClient, tid: str, content: str, replies: int) -> list[dict[str, Any]]:
    """Post a message and wait until the thread is idle with `replies` assistant answers in all."""
    assert (await client.post(f"/threads/{tid}/messages", json={"content": content})).status_code == 202

    async def answered() -> list[dict[str, Any]] | None:
        thread = (await client.get(f"/threads/{tid}")).json()
        rows: list[dict[str, Any]] = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        texts = [m for m in rows if m["role"] == "assistant" and m["content"]]
        return rows if thread["status"] == "idle" and len(texts) == replies else None

    result: list[dict[str, Any]] = await wait_for(answered)
    return result


async def stored_events(app: FastAPI, tid: str) -> list[tuple[str, dict[str, Any]]]:
    async with app.state.runtime.sessions() as session:
        rows = await events.read(session, uuid.UUID(tid), 0)
    return [(r.type, r.data) for r in rows]


async def test_a_handoff_switches_the_agent_and_the_new_one_answers_at_once(app_factory: Any) -> None:
    front = Recorder(call("scheduler", message="They want a meeting."))
    desk = Recorder("When would suit you?", "Booked for tomorrow.")
    app, client, tid = await start(app_factory, catalog(front, desk, Recorder()))
    rows = await say(client, tid, "I need a meeting.", replies=1)
    assert [(m["role"], m["content"], m["model"]) for m in rows] == [
        ("user", "I need a meeting.", None),
        ("assistant", None, "m_front"),
        ("tool", "Handoff complete", None),
        ("assistant", "When would suit you?", "m_desk"),
    ]
    assert rows[2]["tool_status"] == "success" and rows[2]["name"] == "scheduler"
    # the front prompt was offered the handoff, described by the target agent
    offered = {t.name: (t.description, t.parameters) for t in front.requests[0].tools}
    assert offered["scheduler"][0] == "Books meetings."
    assert offered["scheduler"][1]["properties"] == {
        "message": {"type": "string", "description": "An optional note for the agent taking over."}
    }
    # the new agent answered with its own prompt and tools, seeing the input and the handoff
    request = desk.requests[0]
    assert request.messages[0].content == "You schedule."
    assert [t.name for t in request.tools] == ["billing"]
    assert request.messages[1].content == "I need a meeting."
    assert request.messages[-1].content == "Handoff complete"
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["agent"], thread["origin_agent"]) == ("scheduler", "onboarding")
    assert thread["session"]["turns"] == 1  # the handoff is not a turn: only the new agent's answer ended one
    stream = await stored_events(app, tid)
    assert ("agent_handoff", {"from_agent": "onboarding", "to_agent": "scheduler"}) in stream
    assert [d for t, d in stream if t == "turn_ended"] == [{"side": "a", "reason": "stop_on_response"}]
    # the next human message goes to the new agent
    rows = await say(client, tid, "Tomorrow, please.", replies=2)
    assert rows[-1]["content"] == "Booked for tomorrow." and rows[-1]["model"] == "m_desk"
    assert len(front.requests) == 1 and len(desk.requests) == 2


async def test_origin_agent_is_the_first_agent_after_two_handoffs(app_factory: Any) -> None:
    front = Recorder(call("scheduler"))
    desk = Recorder(call("billing", message="Invoice question."))
    billing = Recorder("Your invoice is paid.")
    app, client, tid = await start(app_factory, catalog(front, desk, billing))
    rows = await say(client, tid, "About my invoice.", replies=1)
    assert rows[-1]["content"] == "Your invoice is paid." and rows[-1]["model"] == "m_billing"
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["agent"], thread["origin_agent"]) == ("billing", "onboarding")
    handoffs = [d for t, d in await stored_events(app, tid) if t == "agent_handoff"]
    assert handoffs == [
        {"from_agent": "onboarding", "to_agent": "scheduler"},
        {"from_agent": "scheduler", "to_agent": "billing"},
    ]


async def test_a_handoff_starts_a_fresh_turn_for_the_step_cap(app_factory: Any) -> None:
    """`max_steps: 1` would end the old agent's turn after the handoff step; the new agent still acts."""
    front = Recorder(call("scheduler"))
    desk = Recorder("Hello from the desk.")
    _, client, tid = await start(app_factory, catalog(front, desk, Recorder(), max_steps=1))
    rows = await say(client, tid, "hi", replies=1)
    assert rows[-1]["content"] == "Hello from the desk."


class To(BaseModel):
    to: str


@define_tool(description="Transfer the customer to another agent.")
async def transfer(state: ThreadState, args: To) -> str:
    await state.run_agent(args.to)
    return f"transferred to {args.to}"


async def test_run_agent_hands_the_thread_over_from_a_tool(app_factory: Any) -> None:
    """`state.run_agent(name)` does what a handoff tool does (§12): the agent changes, the first one stays
    `origin_agent`, `agent_handoff` is emitted and the new agent's side A answers in the same run."""
    front = Recorder(call("transfer", to="nobody"), call("transfer", to="scheduler"), call("transfer", to="billing"))
    billing = Recorder("Your invoice is paid.")
    base = catalog(front, Recorder(), billing)
    prompts = dict(base.prompts)
    prompts["front"] = prompts["front"].model_copy(update={"tools": ["transfer"]})
    # `scheduler` shares the front model, and transfers on
    prompts["desk"] = prompts["desk"].model_copy(update={"model": "m_front", "tools": ["transfer"]})
    cat = dataclasses.replace(base, prompts=prompts, tools={"transfer": transfer})
    app, client, tid = await start(app_factory, cat)
    rows = await say(client, tid, "About my invoice.", replies=1)
    results = [(m["tool_status"], m["content"]) for m in rows if m["role"] == "tool"]
    assert results[0] == ("error", "Tool `transfer` failed: AgentNotFound: Agent `nobody` does not exist")
    assert results[1:] == [("success", "transferred to scheduler"), ("success", "transferred to billing")]
    assert rows[-1]["content"] == "Your invoice is paid." and rows[-1]["model"] == "m_billing"
    thread = (await client.get(f"/threads/{tid}")).json()
    assert (thread["agent"], thread["origin_agent"]) == ("billing", "onboarding")
    handoffs = [d for t, d in await stored_events(app, tid) if t == "agent_handoff"]
    assert handoffs == [
        {"from_agent": "onboarding", "to_agent": "scheduler"},
        {"from_agent": "scheduler", "to_agent": "billing"},
    ]
    # outside the thread's own execution (a custom endpoint, a handle on another thread) it is refused
    handle = await outside(app.state.runtime.sessions, cat, app.state.runtime.fernet, uuid.UUID(tid))
    with pytest.raises(errors.OutsideExecution):
        await handle.run_agent("onboarding")
