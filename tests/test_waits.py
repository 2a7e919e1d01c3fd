"""`POST /threads/{id}/messages?wait=`: the answer comes when the input's turn ends, with the messages it wrote; the
API and the worker run as two apps (two hubs, two pools), so the API hears the worker's events only by `NOTIFY`."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app import catalog, events, keys, queue, tables, waits
from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import ThreadState, define_agent, define_model, define_prompt, define_tool
from tests import processes
from tests.conftest import ROOT, client_for, wait_for

GATES: dict[str, asyncio.Event] = {}  # `gate` calls wait on these; a test opens them
SECRET = "hush-hush-4242"  # a thread's secret value, which the failing model's error names


@define_tool(description="Waits until the test opens the gate.")
async def gate(state: ThreadState) -> str:
    await GATES["gate"].wait()
    return "opened"


@define_tool(description="Always raises.")
async def boom(state: ThreadState) -> str:
    raise RuntimeError("the tool broke")


async def respond(request: LLMRequest) -> Any:
    """`gate` calls the tool that waits for the test; anything else is answered at once."""
    last = request.messages[-1]
    if last.role == "user" and last.content == "gate":
        return {"tool_calls": [{"name": "gate"}]}
    if last.role == "user" and last.content == "fail":  # not retried: the step fails with `llm_error`
        return {"error": f"upstream refused the key {SECRET}", "status": 400}
    if last.role == "user" and last.content == "boom":
        return {"tool_calls": [{"name": "boom"}]}
    if last.role == "user" and last.content == "slow":  # the turn's last call: it ends the turn
        await GATES["llm"].wait()
        return "slow answer"
    if last.role == "tool":
        return f"the tool said {last.content}"
    return f"answer to {last.content}"


def gated() -> Catalog:
    model = define_model(name="m", provider="test", respond=respond)
    prompt = define_prompt(name="p", model="m", prompt="Be brief.", include_chat=True, tools=["gate", "boom"])
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."),
        models={"m": model},
        prompts={"p": prompt},
        agents={"agent": agent},
        tools={"gate": gate, "boom": boom},
    )


async def apps(app_factory: Any, catalog: Catalog) -> tuple[FastAPI, FastAPI]:
    """An API app without workers, and a second app whose worker runs the threads."""
    api = await app_factory(catalog)
    worker = await app_factory(catalog, with_worker=True)
    return api, worker


async def thread(client: httpx.AsyncClient, agent: str) -> str:
    response = await client.post("/threads", json={"agent": agent})
    assert response.status_code == 201, response.text
    tid: str = response.json()["id"]
    return tid


def summary(turn: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m["role"], m["content"] or m["tool_calls"][0]["function"]["name"]) for m in turn["messages"]]


async def test_the_answer_comes_with_the_turn(app_factory: Any) -> None:
    api, _ = await apps(app_factory, catalog.load(ROOT / "agents"))
    async with client_for(api) as client:
        tid = await thread(client, "assistant")
        response = await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "What is 12 * (3 + 4)?"})
        assert response.status_code == 200, response.text
        turn = response.json()
        assert turn["done"] is True and turn["status"] == "idle"
        assert turn["messages"][0]["id"] == turn["message_id"]
        assert summary(turn) == [
            ("user", "What is 12 * (3 + 4)?"),
            ("assistant", "calculate"),
            ("tool", "84"),
            ("assistant", "The answer is 84."),
        ]
        listed = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        assert turn["messages"] == listed  # the same shape as the listing

        plain = await client.post(f"/threads/{tid}/messages", json={"content": "2 + 2"})  # unchanged without it
        assert plain.status_code == 202 and plain.json()["status"] == "queued"
        again = (await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "3 * 3"})).json()
        assert again["done"] is True and [m["content"] for m in again["messages"]][::3] == ["3 * 3", "The answer is 9."]


async def test_multipart_waits_too(app_factory: Any) -> None:
    api, _ = await apps(app_factory, catalog.load(ROOT / "agents"))
    async with client_for(api) as client:
        tid = await thread(client, "assistant")
        response = await client.post(
            f"/threads/{tid}/messages",
            params={"wait": "20"},
            data={"content": "What is 6 * 7?"},
            files={"file": ("notes.txt", b"hello", "text/plain")},
        )
        assert response.status_code == 200, response.text
        turn = response.json()
        assert turn["done"] is True and turn["messages"][0]["attachments"][0]["name"] == "notes.txt"
        assert turn["messages"][-1]["content"] == "The answer is 42."


@pytest.mark.parametrize("wait", ["0", "-1", "300.5", "soon", "nan"])
async def test_a_wait_out_of_bounds_is_refused(app_factory: Any, wait: str) -> None:
    api = await app_factory(catalog.load(ROOT / "agents"))
    async with client_for(api) as client:
        tid = await thread(client, "assistant")
        response = await client.post(f"/threads/{tid}/messages?wait={wait}", json={"content": "hi"})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_request"
        assert "wait" in response.json()["error"]["message"]
        assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []  # nothing queued


async def test_time_up_answers_with_the_status_so_far(app_factory: Any) -> None:
    api = await app_factory(catalog.load(ROOT / "agents"))  # no worker anywhere: the input stays queued
    async with client_for(api) as client:
        tid = await thread(client, "assistant")
        started = asyncio.get_running_loop().time()
        response = await client.post(f"/threads/{tid}/messages?wait=0.1", json={"content": "hi"})
        assert asyncio.get_running_loop().time() - started >= 0.1
        turn = response.json()
        assert response.status_code == 200 and turn["done"] is False and turn["status"] == "queued"
        assert turn["outcome"] is None and turn["error"] is None  # not over: nothing to say yet
        [queued] = turn["messages"]
        assert queued["id"] == turn["message_id"] and queued["status"] == "pending" and queued["metadata"]["queued"]
        missing = await client.post(
            "/threads/00000000-0000-4000-8000-000000000000/messages?wait=1", json={"content": "hi"}
        )
        assert missing.status_code == 404


async def test_input_behind_a_turn_ends_with_the_turn_it_joins(app_factory: Any) -> None:
    GATES["gate"] = asyncio.Event()
    api, _ = await apps(app_factory, gated())
    async with client_for(api) as client:
        tid = await thread(client, "agent")
        first = await client.post(f"/threads/{tid}/messages", json={"content": "gate"})
        assert first.status_code == 202

        async def running() -> bool:
            return bool((await client.get(f"/threads/{tid}")).json()["status"] == "running")

        await wait_for(running)
        hub = api.state.runtime.hub
        before = hub.subscribers
        waiting = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=20", json={"content": "later"}))
        await wait_for(lambda: asyncio.sleep(0, hub.subscribers == before + 1))  # queued, and waiting
        await asyncio.sleep(0.1)  # what it has heard so far (its own input queued) ends nothing
        assert not waiting.done()  # its turn is the gated one: still running
        GATES["gate"].set()
        turn = (await waiting).json()
        assert turn["done"] is True and turn["status"] == "idle"
        # delivered into the running turn after the tool's result: that turn's last answer ends it
        assert summary(turn) == [("user", "later"), ("assistant", "answer to later")]
        stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        assert stored[0]["content"] == "gate" and stored[-1]["content"] == "answer to later"


async def test_input_after_a_turns_last_call_waits_for_a_turn_of_its_own(app_factory: Any) -> None:
    GATES["llm"] = asyncio.Event()
    api, _ = await apps(app_factory, gated())
    async with client_for(api) as client:
        tid = await thread(client, "agent")
        await client.post(f"/threads/{tid}/messages", json={"content": "slow"})

        async def calling() -> bool:
            listed = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
            return any(m["status"] == "pending" and m["role"] == "assistant" for m in listed)

        await wait_for(calling)
        hub = api.state.runtime.hub
        before = hub.subscribers
        waiting = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=20", json={"content": "next"}))
        await wait_for(lambda: asyncio.sleep(0, hub.subscribers == before + 1))  # queued during the call, waiting
        GATES["llm"].set()  # the running turn ends with its answer; the input then starts its own
        turn = (await waiting).json()
        assert turn["done"] is True and turn["status"] == "idle"
        assert summary(turn) == [("user", "next"), ("assistant", "answer to next")]
        stored = [m["content"] for m in (await client.get(f"/threads/{tid}/messages")).json()["messages"]]
        assert stored == ["slow", "slow answer", "next", "answer to next"]


async def test_a_failed_turn_says_so(app_factory: Any) -> None:
    """A model call that fails (after its retries and fallbacks) fails the turn: the wait answers `outcome: failed`
    with the error, and the failed message carries it, stored and streamed alike, the thread's secrets masked."""
    api, _ = await apps(app_factory, gated())
    async with client_for(api) as client:
        created = await client.post("/threads", json={"agent": "agent", "env": {"TOKEN": SECRET}, "secrets": ["TOKEN"]})
        tid = created.json()["id"]
        response = await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "fail"})
        assert response.status_code == 200 and SECRET not in response.text
        turn = response.json()
        assert turn["done"] is True and turn["status"] == "idle" and turn["outcome"] == "failed"
        error = {"code": "llm_error", "message": "upstream refused the key ***"}
        assert turn["error"] == error
        asked, failed = turn["messages"]
        assert asked["content"] == "fail" and failed["role"] == "assistant" and failed["status"] == "failed"
        assert failed["metadata"]["error"] == error
        assert (await client.get(f"/threads/{tid}/messages")).json()["messages"][-1] == failed  # stored
        async with api.state.runtime.sessions() as session:
            logged = await events.read(session, uuid.UUID(tid), 0, 500)
        streamed = [e.data["data"] for e in logged if e.type == "message_data" and e.data["message_id"] == failed["id"]]
        assert (streamed[-1]["status"], streamed[-1]["metadata"]) == ("failed", failed["metadata"])  # and streamed
        assert SECRET not in str([e.data for e in logged])

        again = (await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "hello"})).json()
        assert again["outcome"] == "completed" and again["error"] is None  # one field to branch on


async def test_a_tool_error_completes_the_turn_and_the_step_cap_fails_it(app_factory: Any) -> None:
    api = await app_factory(gated())
    await app_factory(gated(), with_worker=True, max_session_steps=2)
    async with client_for(api) as client:
        tid = await thread(client, "agent")
        tool = (await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "boom"})).json()
        assert tool["outcome"] == "completed" and tool["error"] is None  # the model sees the error and answers
        assert [m["tool_status"] for m in tool["messages"]] == [None, None, "error", None]
        capped = (await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "hi"})).json()
        assert capped["done"] is True and capped["status"] == "idle" and capped["outcome"] == "failed"
        assert capped["error"]["code"] == "max_total_steps" and "MAX_SESSION_STEPS" in capped["error"]["message"]
        assert [m["content"] for m in capped["messages"]] == ["hi"]  # no step was taken


async def test_a_stop_ends_the_wait(app_factory: Any) -> None:
    GATES["gate"] = asyncio.Event()
    api, _ = await apps(app_factory, gated())
    async with client_for(api) as client:
        tid = await thread(client, "agent")
        waiting = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=20", json={"content": "gate"}))

        async def running() -> bool:
            return bool((await client.get(f"/threads/{tid}")).json()["status"] == "running")

        await wait_for(running)
        assert (await client.post(f"/threads/{tid}/stop")).status_code == 200
        turn = (await waiting).json()
        assert turn["done"] is True and turn["status"] == "stopped"
        assert turn["outcome"] == "stopped" and turn["error"] is None
        assert summary(turn)[0] == ("user", "gate") and turn["messages"][-1]["role"] == "system"

        # a system message wakes no stopped thread: the answer is at once, the input still queued
        started = asyncio.get_running_loop().time()
        parked = await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "note", "role": "system"})
        assert asyncio.get_running_loop().time() - started < 5
        turn = parked.json()
        assert turn["done"] is False and turn["status"] == "stopped" and turn["outcome"] is None
        assert [(m["content"], m["status"]) for m in turn["messages"]] == [("note", "pending")]
        GATES["gate"].set()


async def test_a_two_sided_session_is_waited_for_to_its_end(app_factory: Any) -> None:
    api, _ = await apps(app_factory, catalog.load(ROOT / "agents"))
    async with client_for(api) as client:
        tid = await thread(client, "haiku_review")
        response = await client.post(f"/threads/{tid}/messages?wait=20", json={"content": "A haiku about the sea"})
        turn = response.json()
        assert turn["done"] is True and turn["status"] == "idle" and turn["outcome"] == "completed"
        assert {m["side"] for m in turn["messages"]} == {"a", "b"}
        session = (await client.get(f"/threads/{tid}")).json()["session"]
        assert session["status"] == "success"


async def test_a_client_that_hangs_up_leaves_nothing_behind(app_factory: Any, serve: Any) -> None:
    api = await app_factory(catalog.load(ROOT / "agents"))  # no worker: the wait would last its whole time
    base = await serve(api)
    hub = api.state.runtime.hub
    async with httpx.AsyncClient(base_url=base) as client:
        tid = await thread(client, "assistant")
        before = hub.subscribers
        request = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=60", json={"content": "hi"}))
        await wait_for(lambda: asyncio.sleep(0, hub.subscribers == before + 1))
        pool = api.state.runtime.db.pool
        await wait_for(lambda: asyncio.sleep(0, pool.checkedout() == 0), timeout=2)  # waiting holds no connection
        request.cancel()  # the connection closes
        with pytest.raises(asyncio.CancelledError):
            await request
    await wait_for(lambda: asyncio.sleep(0, hub.subscribers == before), timeout=5)


async def test_input_set_aside_ends_the_wait(app_factory: Any) -> None:
    """What the engine does with input whose delivery fails (`Engine._run_all`), done here to a queued message."""
    api = await app_factory(catalog.load(ROOT / "agents"))
    async with client_for(api) as client:
        tid = await thread(client, "assistant")
        waiting = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=20", json={"content": "hi"}))

        async def queued() -> list[tables.Inbox]:
            async with api.state.runtime.sessions() as session:
                return await queue.pending(session, uuid.UUID(tid))

        [row] = await wait_for(queued)
        async with api.state.runtime.sessions() as session, session.begin():
            await queue.set_aside(session, row.id, "input message could not be delivered: KeyError: 'id'")
            await events.append(session, uuid.UUID(tid), "error", {"code": "input_set_aside", "message": "..."})
        turn = (await waiting).json()
        assert turn["done"] is True and turn["outcome"] == "failed"
        why = {"code": "input_set_aside", "message": "input message could not be delivered: KeyError: 'id'"}
        [message] = turn["messages"]
        assert turn["error"] == why and message["metadata"]["error"] == why
        assert message["status"] == "failed" and message["metadata"]["set_aside"] is True
        # it will never be delivered: it cannot be edited, but it can be deleted (and is then gone from the list)
        url = f"/threads/{tid}/messages/{message['id']}"
        assert (await client.patch(url, json={"content": "hello"})).status_code == 409
        assert (await client.delete(url)).status_code == 204
        listed = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        assert message["id"] not in [m["id"] for m in listed]
        assert (await client.delete(url)).status_code == 404


async def test_a_revoked_key_ends_the_wait(app_factory: Any) -> None:
    api = await app_factory(catalog.load(ROOT / "agents"))
    async with api.state.runtime.sessions() as session:
        row, key = await keys.create(session, "alice")
        await session.commit()
    async with client_for(api, key) as client:
        tid = await thread(client, "assistant")
        waiting = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=60", json={"content": "hi"}))
        await wait_for(lambda: asyncio.sleep(0, api.state.runtime.hub.subscribers == 1))
        async with api.state.runtime.sessions() as session:
            assert await keys.revoke(session, str(row.id)) == 1
            await session.commit()
        response = await asyncio.wait_for(waiting, 10)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"


def test_what_the_log_says_of_a_turn() -> None:
    mine, other = uuid.uuid4(), uuid.uuid4()

    def data(message_id: uuid.UUID, depth: int = 0) -> dict[str, Any]:
        return {"message_id": str(message_id), "depth": depth, "data": {}}

    turn = waits.Turn(mine)
    turn.see("message_data", data(other))  # a turn before its delivery: not its own
    turn.see("thread_status", {"status": "stopped"})
    assert turn.over and not turn.done  # parked: stopped before its delivery
    turn.see("thread_status", {"status": "queued"})  # a human message ended the stop
    assert not turn.over
    turn.see("message_data", data(mine))
    turn.see("message_data", data(other, depth=1))  # a subprompt's: not listed
    turn.see("message_data", data(other))
    turn.see("thread_status", {"status": "running"})
    assert not turn.over
    turn.see("thread_status", {"status": "idle"})
    assert turn.done and turn.status == "idle" and list(turn.produced) == [mine, other]
    turn.see("message_data", data(uuid.uuid4()))  # the next turn's: not this one's
    assert list(turn.produced) == [mine, other]

    assert turn.outcome == "completed" and turn.error is None

    never = waits.Turn(mine)
    never.see("thread_terminated", {})
    assert never.over and not never.done and never.status == "terminated" and never.outcome is None

    crashed = waits.Turn(mine)
    crashed.see("error", {"code": "internal_error", "message": "a turn before its delivery"})  # not its own
    crashed.see("message_data", data(mine))
    crashed.see("error", {"code": "input_set_aside", "message": "another input's"})  # not its own either
    assert crashed.error is None and crashed.outcome is None
    crashed.see("error", {"code": "crashed", "message": "The run crashed 3 times"})
    crashed.see("session_ended", {"status": "failure", "reason": "crashed"})
    crashed.see("thread_status", {"status": "idle"})
    assert crashed.outcome == "failed" and crashed.error == {"code": "crashed", "message": "The run crashed 3 times"}

    ended = waits.Turn(mine)  # a session that ended failed without an `error` event: its reason says why
    ended.see("message_data", data(mine))
    ended.see("session_ended", {"status": "failure", "reason": "session_fail", "result": {"content": "no rhyme"}})
    ended.see("thread_status", {"status": "idle"})
    assert ended.outcome == "failed" and ended.error == {"code": "session_fail", "message": "no rhyme"}

    terminated = waits.Turn(mine)
    terminated.see("message_data", data(mine))
    terminated.see("session_ended", {"status": "failure", "reason": "terminated"})
    terminated.see("thread_terminated", {})
    assert terminated.outcome == "terminated" and terminated.error is None


@pytest.mark.slow  # a real API process, stopped
async def test_a_server_that_stops_answers_its_waits_first(database_url: str, tmp_path: Path) -> None:
    """`agents api` on SIGTERM: a wait in progress answers at once with what there is, within the grace period."""
    port = processes.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR")}
    env |= {"DATABASE_URL": database_url, "PORT": str(port), "DATA_DIR": str(tmp_path)}
    log = tmp_path / "api.log"
    server = processes.start(["api"], env, log)  # no worker anywhere: the input stays queued
    base = f"http://127.0.0.1:{port}"
    try:
        await processes.until_ready(base, server, log)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            tid = await thread(client, "assistant")
            waiting = asyncio.create_task(client.post(f"/threads/{tid}/messages?wait=120", json={"content": "hi"}))
            await asyncio.sleep(0.5)
            started = asyncio.get_running_loop().time()
            server.terminate()
            response = await waiting
            assert asyncio.get_running_loop().time() - started < 4  # before uvicorn's 5 s grace ends
        assert response.status_code == 200, response.text
        assert response.json()["done"] is False and response.json()["status"] == "queued"
    finally:
        assert processes.stop(server) == 0, log.read_text()
