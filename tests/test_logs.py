"""A thread's logs through the API: one at a time with the whole request its model call was sent
(`LOG_REQUESTS=full`) or only the brief, the known secret values masked in both; clear 404s."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx

from app.catalog import Catalog
from app.spec import define_agent, define_model, define_prompt
from tests.conftest import client_for
from tests.test_engine import settle
from tests.tools import add

SECRET = "log-s3cret-4242"


def catalog() -> Catalog:
    model = define_model(name="m", provider="test", script=["sure"])
    prompt = define_prompt(name="p", model="m", prompt="Be brief.", include_chat=True, tools=["add"])
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={"add": add}
    )


async def turn(app_factory: Any, drive: Any, log_requests: str | None) -> tuple[httpx.AsyncClient, str, dict[str, Any]]:
    """A thread whose user says a secret of its env; its one model call's log entry in the list."""
    app = await app_factory(catalog(), log_requests=log_requests)
    client = client_for(app)
    created = await client.post("/threads", json={"agent": "agent", "env": {"TOKEN": SECRET}, "secrets": ["TOKEN"]})
    assert created.status_code == 201, created.text
    tid = created.json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": f"my token is {SECRET}, keep it"})
    await drive(app)
    await settle(client, tid)
    [listed] = (await client.get(f"/threads/{tid}/logs", params={"kind": "llm"})).json()["logs"]
    return client, tid, listed


async def test_full_mode_keeps_the_whole_request_masked_and_shows_it_one_log_at_a_time(
    app_factory: Any, drive: Any
) -> None:
    client, tid, listed = await turn(app_factory, drive, "full")
    assert "request_full" not in listed  # the list stays small: the whole request is read one log at a time
    one = await client.get(f"/threads/{tid}/logs/{listed['id']}")
    assert one.status_code == 200, one.text
    body = one.json()
    assert {k: body[k] for k in listed} == listed
    full = body["request_full"]
    assert [(m["role"], m["content"]) for m in full["messages"]] == [
        ("system", "Be brief."),
        ("user", "my token is ***, keep it"),
    ]
    assert [t["name"] for t in full["tools"]] == ["add"]
    assert full["tools"][0]["parameters"]["type"] == "object"
    assert full["model"] == "m" and "provider_options" in full and "tool_choice" in full
    assert SECRET not in one.text and SECRET not in listed["request"]["last"]
    assert listed["request"]["last"] == "my token is ***, keep it"


async def test_brief_mode_keeps_no_whole_request(app_factory: Any, drive: Any) -> None:
    client, tid, listed = await turn(app_factory, drive, "brief")
    body = (await client.get(f"/threads/{tid}/logs/{listed['id']}")).json()
    assert body["request_full"] is None
    assert body["request"] == {"model": "m", "messages": 2, "tools": ["add"], "last": "my token is ***, keep it"}


async def test_unset_is_brief_outside_agents_serve(app_factory: Any, drive: Any) -> None:
    client, tid, listed = await turn(app_factory, drive, None)
    assert (await client.get(f"/threads/{tid}/logs/{listed['id']}")).json()["request_full"] is None


async def test_unknown_ids_are_clear_404s(app_factory: Any, drive: Any) -> None:
    client, tid, listed = await turn(app_factory, drive, "full")
    missing = await client.get(f"/threads/{tid}/logs/{uuid.uuid4()}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "log_not_found"
    other = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    elsewhere = await client.get(f"/threads/{other}/logs/{listed['id']}")  # a log of another thread
    assert elsewhere.status_code == 404 and elsewhere.json()["error"]["code"] == "log_not_found"
    no_thread = await client.get(f"/threads/{uuid.uuid4()}/logs/{listed['id']}")
    assert no_thread.status_code == 404 and no_thread.json()["error"]["code"] == "thread_not_found"
    assert (await client.get(f"/threads/{tid}/logs/not-an-id")).status_code == 422
