"""The example agents under `agents/`, run offline end to end the way the README shows them."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from app import catalog
from tests.conftest import ROOT, client_for, wait_for


async def test_the_launch_team_example_runs_the_whole_tree(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    client = client_for(app)
    body = {"agent": "launch", "messages": [{"content": "Write the launch note for the harbour café."}]}
    tid = (await client.post("/threads", json=body)).json()["id"]

    async def ended() -> dict[str, Any] | None:
        thread: dict[str, Any] = (await client.get(f"/threads/{tid}")).json()
        return thread if thread["session"]["status"] == "success" and thread["status"] == "idle" else None

    thread = await wait_for(ended, timeout=30)
    assert thread["session"]["result"]["content"].startswith("Accepted: Launch note ready. Polished:")
    rows = (await client.get(f"/threads/{tid}/messages", params={"include_silent": True})).json()["messages"]
    tools = {r["name"]: r for r in rows if r["role"] == "tool"}
    assert tools["subagent_create"]["content"].startswith("The subagent was initiated successfully. Reference: ")
    assert tools["qa_team"]["content"].startswith("Approved: a short, friendly launch note.\n\nReference: ")
    [draft] = tools["qa_team"]["attachments"]  # the reviewer's file, copied into the coordinator's thread
    assert (await client.get(f"/threads/{tid}/fs{draft['path']}")).text.startswith("# The harbour café opens")
    assert tools["polish"]["content"].startswith("Polished: ")
    subagents = (await client.get(f"/threads/{tid}/subagents")).json()["subagents"]
    assert sorted((s["name"], s["resumable"], s["blocking"]) for s in subagents) == [
        ("qa_team", False, True),
        ("researcher", True, False),
    ]
    statuses = {s["name"]: s["status"] for s in subagents}
    assert statuses["qa_team"] == "terminated"


async def test_the_launch_team_publishes_after_the_bootstrap_flow(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    client = client_for(app)
    body = {
        "agent": "launch",
        "env": {"PUBLISH": "yes"},
        "messages": [{"content": "Write the launch note for the harbour café."}],
    }
    tid = (await client.post("/threads", json=body)).json()["id"]

    async def session_ended(number: int) -> dict[str, Any] | None:
        thread: dict[str, Any] = (await client.get(f"/threads/{tid}")).json()
        ok = thread["session"]["number"] == number and thread["session"]["status"] == "success"
        return thread if ok and thread["status"] == "idle" else None

    first = await wait_for(lambda: session_ended(1), timeout=30)
    content = first["session"]["result"]["content"]
    assert "Publishing waits for CMS_TOKEN: /threads/" in content
    endpoint = content.rsplit("CMS_TOKEN: ", 1)[1]
    assert (await client.get(endpoint)).json()["missing"] == ["CMS_TOKEN"]
    done = await client.post(endpoint, json={"env": {"CMS_TOKEN": "cms-secret-token"}})
    assert done.status_code == 200, done.text
    second = await wait_for(lambda: session_ended(2), timeout=30)
    assert (
        second["session"]["result"]["content"]
        == "Accepted: Published: Published the launch note to the café's website."
    )
    publisher = (await client.get(f"/threads/{done.json()['child_thread_id']}")).json()
    assert publisher["env_types"]["CMS_TOKEN"] == "secret" and publisher["env"]["CMS_TOKEN"] is None


def _demo_reply(text: str) -> Any:
    respond = catalog.load(ROOT / "agents").models["demo"].respond
    assert respond is not None
    message = SimpleNamespace(role="user", content=text, name=None)
    return respond(SimpleNamespace(messages=[message]))


def test_the_demo_model_finds_arithmetic_in_linear_time() -> None:
    """Its first version's regex took 1.5 s on 8,000 digits and hours on a million characters."""
    expression = _demo_reply("What is 12 * (3 + 4)?")["tool_calls"][0]["arguments"]["expression"]
    assert expression == "12 * (3 + 4)"
    assert _demo_reply("and (1) then 7 / 2.5?")["tool_calls"][0]["arguments"]["expression"] == "7 / 2.5"
    assert "text" in _demo_reply("route 66 north")
    for text in ("1" * 1_000_000, "1 " * 500_000, "9" * 999_999 + "+1"):
        started = time.process_time()  # this process's CPU time: a loaded machine does not count against it
        _demo_reply(text)
        assert time.process_time() - started < 5.0  # linear takes ~0.2 s; the quadratic regex took hours
