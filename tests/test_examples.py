"""The example agents under `agents/`, run offline end to end the way the README shows them."""

from __future__ import annotations

from typing import Any

from app.catalog import load as load_catalog
from tests.conftest import ROOT, client_for, wait_for


async def test_the_launch_team_example_runs_the_whole_tree(app_factory: Any) -> None:
    app = await app_factory(load_catalog(ROOT / "agents"), with_worker=True)
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
