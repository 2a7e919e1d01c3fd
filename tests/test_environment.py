"""Variables: resolution across thread, user, instance, agent, tool config and prompt; the user and instance routes;
secrets that never leave (`semantics.md` §8)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from cryptography.fernet import Fernet
from fastapi import FastAPI
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import children, environment, events, keys, queue, statements, tables, threads, variable_requests
from app.catalog import Catalog
from app.llm.base import LLMRequest
from app.spec import ThreadState, ToolEntry, VariableDefinition, define_agent, define_model, define_prompt, define_tool
from tests.conftest import client_for, wait_for
from tests.test_api import assert_error

LEVELS = ["thread", "user", "instance", "agent", "tool", "prompt"]


@define_tool(description="Reads X.")
async def read_x(state: ThreadState) -> str:
    return await state.env("X")


@define_tool(description="Sets X to `new`.")
async def set_x(state: ThreadState) -> str:
    await state.set_env("X", "new")
    return "set"


@define_tool(description="Echoes every secret, in its result and in a custom event.")
async def echo(state: ThreadState) -> str:
    values = [await state.env("T_SECRET"), await state.env("U_SECRET"), await state.env("I_SECRET")]
    await state.emit("debug", {"keys": values, values[0]: "as a key too"})
    return " ".join(values)


@define_tool(description="Fails, naming a secret.")
async def boom(state: ThreadState) -> str:
    raise RuntimeError(f"cannot connect with {await state.env('I_SECRET')}")


TOOLS = {t.name: t for t in (read_x, echo, boom)}


def catalog(
    script: list[Any],
    *,
    agent_env: dict[str, str] | None = None,
    tool_env: dict[str, str] | None = None,
    prompt_env: dict[str, str] | None = None,
    variables: list[dict[str, Any]] | None = None,
    prompt: Any = "sys",
) -> Catalog:
    model = define_model(name="m", provider="test", script=script)
    p = define_prompt(
        name="p",
        tool_description="t",
        model="m",
        prompt=prompt,
        tools=[{"name": "read_x", "env": tool_env or {}}, "echo", "boom"],
        env=prompt_env or {},
        variables=variables or [],
    )
    agent = define_agent(name="agent", side_a={"prompt": "p"}, env=agent_env or {})
    return Catalog(root=Path("."), models={"m": model}, prompts={"p": p}, agents={"agent": agent}, tools=TOOLS)


async def key(app: FastAPI, user: str, admin: bool = False) -> str:
    async with app.state.runtime.sessions() as s, s.begin():
        _, plain = await keys.create(s, user, admin)
    return plain


async def settle(client: httpx.AsyncClient, tid: str) -> dict[str, Any]:
    async def idle() -> dict[str, Any] | None:
        thread: dict[str, Any] = (await client.get(f"/threads/{tid}")).json()
        return thread if thread["status"] == "idle" and thread["session"]["number"] > 0 else None

    result: dict[str, Any] = await wait_for(idle)
    return result


async def run(client: httpx.AsyncClient, drive: Any, **body: Any) -> tuple[str, list[dict[str, Any]]]:
    """A new thread's turn on `go`, run to its end (no worker: `drive`); its id and messages."""
    created = await client.post("/threads", json={"agent": "agent", **body})
    assert created.status_code == 201, created.text
    tid = created.json()["id"]
    assert (await client.post(f"/threads/{tid}/messages", json={"content": "go"})).status_code == 202
    await drive(client._transport.app)  # type: ignore[attr-defined]
    await settle(client, tid)
    rows = (await client.get(f"/threads/{tid}/messages", params={"include_silent": True})).json()["messages"]
    return tid, rows


# -- resolution ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
async def test_each_level_beats_the_ones_below(app_factory: Any, drive: Any, level: str) -> None:
    """X is defined at `level` and at every lower level, each with its level's name: `level` wins."""
    defined = LEVELS[LEVELS.index(level) :]

    def at(name: str) -> dict[str, str]:
        return {"X": name} if name in defined else {}

    cat = catalog(
        [{"tool_calls": [{"name": "read_x"}]}, "ok"],
        agent_env=at("agent"),
        tool_env=at("tool"),
        prompt_env=at("prompt"),
    )
    app = await app_factory(cat)
    async with client_for(app) as client:  # open mode: the caller is the local admin
        for scope in ("user", "instance"):
            if scope in defined:
                response = await client.put(f"/env/{scope}/X", json={"value": scope})
                assert response.status_code == 200, response.text
        _, rows = await run(client, drive, env=at("thread"))
    assert [m["content"] for m in rows if m["role"] == "tool"] == [level]


async def test_state_env_names_a_variable_nothing_defines(app_factory: Any, drive: Any) -> None:
    app = await app_factory(catalog([{"tool_calls": [{"name": "read_x"}]}, "ok"]))
    async with client_for(app) as client:
        _, rows = await run(client, drive)
    (result,) = [m for m in rows if m["role"] == "tool"]
    assert result["tool_status"] == "error" and "`X` is not set" in result["content"]


async def test_user_values_are_the_thread_owners(app_factory: Any, drive: Any) -> None:
    app = await app_factory(catalog([{"tool_calls": [{"name": "read_x"}]}, "ok"]))
    alice, bob = await key(app, "alice"), await key(app, "bob")
    async with client_for(app, alice) as a, client_for(app, bob) as b:
        assert (await a.put("/env/user/X", json={"value": "alice's"})).status_code == 200
        _, rows = await run(b, drive)
        assert "`X` is not set" in next(m["content"] for m in rows if m["role"] == "tool")
        _, rows = await run(a, drive)
        assert next(m["content"] for m in rows if m["role"] == "tool") == "alice's"


async def test_a_secret_is_never_rendered_into_a_prompt(app_factory: Any, drive: Any) -> None:
    cat = catalog(["never"], prompt=[{"type": "text", "content": "Use "}, {"type": "env", "property": "X"}])
    app = await app_factory(cat)
    async with client_for(app) as client:
        assert (await client.put("/env/instance/X", json={"value": "hidden-value", "type": "secret"})).is_success
        created = (await client.post("/threads", json={"agent": "agent"})).json()
        await client.post(f"/threads/{created['id']}/messages", json={"content": "go"})
        await drive(app)
        thread = await settle(client, created["id"])
    assert thread["session"]["reason"] == "llm_error"
    async with app.state.runtime.sessions() as session:
        found = [r.data for r in await events.read(session, uuid.UUID(created["id"]), 0) if r.type == "error"]
    assert found[0]["code"] == "missing_variable" and "`X` is secret" in found[0]["message"]


# -- required variables at creation ---------------------------------------------------------------------------


async def test_missing_variables_are_satisfied_by_user_and_instance_env(app_factory: Any) -> None:
    variables = [{"name": "REGION", "required": True}, {"name": "TOKEN", "type": "secret", "required": True}]
    app = await app_factory(catalog(["ok"], variables=variables))
    alice, bob, admin = await key(app, "alice"), await key(app, "bob"), await key(app, "root", admin=True)
    async with client_for(app, alice) as a, client_for(app, bob) as b, client_for(app, admin) as root:
        refused = await a.post("/threads", json={"agent": "agent"})
        assert refused.status_code == 422 and refused.json()["error"]["details"]["missing"] == ["REGION", "TOKEN"]
        assert (await a.put("/env/user/REGION", json={"value": "eu"})).status_code == 200
        assert (await root.put("/env/instance/TOKEN", json={"value": "tok", "type": "secret"})).status_code == 200
        created = await a.post("/threads", json={"agent": "agent"})
        assert created.status_code == 201, created.text
        assert created.json()["env"] == {}  # inherited values stay where they are
        refused = await b.post("/threads", json={"agent": "agent"})
        assert refused.status_code == 422 and refused.json()["error"]["details"]["missing"] == ["REGION"]


def graph(top_variables: list[dict[str, Any]]) -> Catalog:
    """An agent whose graph reaches a subprompt, a subagent and a handoff target, each declaring a required
    variable only its own `env` supplies, plus a callable whose variable only its tool entry's `env` supplies."""
    model = define_model(name="m", provider="test", script=["ok"])
    need = [{"name": "NEED", "required": True}]
    prompts = {
        "top": define_prompt(
            name="top",
            model="m",
            prompt="sys",
            variables=top_variables,
            tools=["sub", "child", "other", {"name": "read_x", "env": {"X": "tool"}}],
        ),
        "sub": define_prompt(
            name="sub", tool_description="s", model="m", prompt="s", variables=need, env={"NEED": "1"}
        ),
        "kid": define_prompt(name="kid", model="m", prompt="k", variables=[{"name": "KID", "required": True}]),
        "desk": define_prompt(name="desk", model="m", prompt="d", variables=[{"name": "DESK", "required": True}]),
    }
    agents = {
        "agent": define_agent(name="agent", side_a={"prompt": "top"}),
        "child": define_agent(
            name="child",
            type="dual_ai",
            expose_as_tool=True,
            tool_description="c",
            side_a={"prompt": "kid", "stop_on_response": True},
            side_b={"prompt": "kid"},
            env={"KID": "child's"},
        ),
        "other": define_agent(
            name="other", side_a={"prompt": "desk"}, expose_as_tool=True, tool_description="o", env={"DESK": "x"}
        ),
    }
    tools = {"read_x": dataclasses.replace(read_x, variables=[VariableDefinition(name="X", required=True)])}
    return Catalog(root=Path("."), models={"m": model}, prompts=prompts, agents=agents, tools=tools)


async def test_required_variables_resolve_where_they_are_read(app_factory: Any) -> None:
    """A subprompt's, a subagent's and a handoff target's own `env` and a tool entry's `env` supply the variables
    declared under them; they supply nothing to the prompt above them (§8)."""
    app = await app_factory(graph([]))
    async with client_for(app) as client:
        created = await client.post("/threads", json={"agent": "agent"})
        assert created.status_code == 201, created.text
    app = await app_factory(graph([{"name": name, "required": True} for name in ("NEED", "KID", "DESK", "X")]))
    async with client_for(app) as client:
        refused = assert_error(await client.post("/threads", json={"agent": "agent"}), 422, "missing_variables")
        assert refused["details"]["missing"] == ["DESK", "KID", "NEED", "X"]
        env = {"DESK": "1", "KID": "1", "NEED": "1", "X": "1"}
        assert (await client.post("/threads", json={"agent": "agent", "env": env})).status_code == 201


def optional_branch(*, agent_env: dict[str, str] | None = None, prompt_env: dict[str, str] | None = None) -> Catalog:
    """An agent whose prompt lists `kid` as `{"optional": "USE_X", "immediate": true}`; a tool of `kid`'s side A
    requires `NEEDX`."""
    model = define_model(name="m", provider="test", script=["ok"])
    needs = dataclasses.replace(read_x, variables=[VariableDefinition(name="NEEDX", required=True)])
    prompts = {
        "top": define_prompt(
            name="top",
            model="m",
            prompt="sys",
            env=prompt_env or {},
            tools=[{"name": "kid", "optional": "USE_X", "immediate": True}],
        ),
        "kidp": define_prompt(name="kidp", model="m", prompt="k", tools=["read_x"]),
    }
    agents = {
        "agent": define_agent(name="agent", side_a={"prompt": "top"}, env=agent_env or {}),
        "kid": define_agent(
            name="kid",
            type="dual_ai",
            expose_as_tool=True,
            tool_description="k",
            side_a={"prompt": "kidp"},
            side_b={"prompt": "kidp"},
        ),
    }
    return Catalog(root=Path("."), models={"m": model}, prompts=prompts, agents=agents, tools={"read_x": needs})


async def test_a_disabled_optional_branch_requires_nothing(app_factory: Any) -> None:
    """A subagent entry whose `optional` flag is off is not available (spec "Subagents" §5.1), so creating a thread
    does not ask for the variables of its graph; the flag is read where a step reads it: the posted env, the user's
    and the instance's values, then the agent's and the prompt's `env` (§6.6, §8)."""
    app = await app_factory(optional_branch())
    alice, admin = await key(app, "alice"), await key(app, "root", admin=True)
    async with client_for(app, alice) as client, client_for(app, admin) as root:
        for env in ({}, {"USE_X": "no"}, {"USE_X": "0"}):
            created = await client.post("/threads", json={"agent": "agent", "env": env})
            assert created.status_code == 201, (env, created.text)
        for env in ({"USE_X": "YES"}, {"USE_X": " true "}, {"USE_X": "1"}):
            created = await client.post("/threads", json={"agent": "agent", "env": env})
            refused = assert_error(created, 422, "missing_variables")
            assert refused["details"]["missing"] == ["NEEDX"], env
        env = {"USE_X": "yes", "NEEDX": "x"}
        assert (await client.post("/threads", json={"agent": "agent", "env": env})).status_code == 201
        assert (await root.put("/env/instance/USE_X", json={"value": "yes", "type": "secret"})).status_code == 200
        assert_error(await client.post("/threads", json={"agent": "agent"}), 422, "missing_variables")
        assert (await client.put("/env/user/USE_X", json={"value": "no"})).status_code == 200  # the user's win
        assert (await client.post("/threads", json={"agent": "agent"})).status_code == 201
    for cat in (optional_branch(agent_env={"USE_X": "yes"}), optional_branch(prompt_env={"USE_X": "yes"})):
        app = await app_factory(cat)
        async with client_for(app, await key(app, "bob")) as client:
            assert_error(await client.post("/threads", json={"agent": "agent"}), 422, "missing_variables")
            created = await client.post("/threads", json={"agent": "agent", "env": {"USE_X": "no"}})
            assert created.status_code == 201, created.text  # the thread's value wins


def family() -> Catalog:
    """A parent that starts two resumable children, sets X, then messages both: `kid` inherits X, `walled` declares
    it scoped (its own agent `env` gives it)."""

    def respond(request: LLMRequest) -> Any:
        who = request.messages[0].content
        results = [m for m in request.messages if m.role == "tool"]
        if who == "quiet":  # a child's side B: repeats what side A said, which ends the child's session
            return request.messages[-1].content
        if who == "reader":  # a child's side A: read X, then say what it read
            return f"X={results[-1].content}" if request.messages[-1].role == "tool" else {"tool_calls": [read]}
        refs = [(m.content or "").rsplit("Reference: ", 1)[-1] for m in results if "Reference: " in (m.content or "")]
        if len(results) == 0:
            return {"tool_calls": [create("kid"), create("walled")]}
        if len(results) == 2:
            return {"tool_calls": [{"name": "set_x"}]}
        if len(results) == 3:
            return {"tool_calls": [message(ref) for ref in refs]}
        return "done"

    read = {"name": "read_x"}

    def create(agent: str) -> dict[str, Any]:
        return {"name": "subagent_create", "arguments": {"agent": agent, "message": "read", "attachments": []}}

    def message(ref: str) -> dict[str, Any]:
        return {"name": "subagent_message", "arguments": {"referenceId": ref, "message": "again", "attachments": []}}

    model = define_model(name="m", provider="test", respond=respond)
    resumable = {"receives_messages": "side_a"}
    prompts = {
        "boss": define_prompt(
            name="boss",
            model="m",
            prompt="boss",
            include_chat=True,
            include_past_tools=True,
            tools=[{"name": "kid", "resumable": resumable}, {"name": "walled", "resumable": resumable}, "set_x"],
        ),
        "reader": define_prompt(
            name="reader", model="m", prompt="reader", include_chat=True, include_past_tools=True, tools=["read_x"]
        ),
        "quiet": define_prompt(name="quiet", model="m", prompt="quiet", include_chat=True),
    }
    child = {
        "type": "dual_ai",
        "expose_as_tool": True,
        "tool_description": "Reads X.",
        "max_session_turns": 1,
        "side_a": {"prompt": "reader", "stop_on_response": True},
        "side_b": {"prompt": "quiet", "stop_on_response": True},
    }
    agents = {
        "boss": define_agent(name="boss", side_a={"prompt": "boss"}),
        "kid": define_agent(name="kid", **child),
        "walled": define_agent(
            name="walled", env={"X": "walled's"}, variables=[{"name": "X", "scoped": True}], **child
        ),
    }
    tools = {"read_x": read_x, "set_x": set_x}
    return Catalog(root=Path("."), models={"m": model}, prompts=prompts, agents=agents, tools=tools)


async def test_set_env_reaches_live_descendants_but_not_a_scoped_subtree(app_factory: Any, drive: Any) -> None:
    """`state.set_env` in the parent writes the live children's env too, so a child's next step reads the new
    value; a child whose graph declares the name scoped keeps its own (§8)."""
    app = await app_factory(family())
    async with client_for(app) as client:
        created = await client.post("/threads", json={"agent": "boss", "env": {"X": "old"}})
        assert created.status_code == 201, created.text
        tid = created.json()["id"]
        assert (await client.post(f"/threads/{tid}/messages", json={"content": "go"})).status_code == 202
        await drive(app)
        await settle(client, tid)
        rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        results = [m for m in rows if m["role"] == "tool"]
        assert [m["content"].split("\n")[0] for m in results] == [
            "X=old", "X=walled's", "set", "X=new", "X=walled's"
        ]  # fmt: skip
        kid, walled = results[0]["subagent_id"], results[1]["subagent_id"]
        assert (await client.get(f"/threads/{kid}")).json()["env"] == {"X": "new"}
        assert (await client.get(f"/threads/{walled}")).json()["env"] == {}
        assert (await client.get(f"/threads/{tid}")).json()["env"] == {"X": "new"}


# -- the routes -----------------------------------------------------------------------------------------------


async def test_user_env_routes_reach_only_the_callers_own_values(app_factory: Any) -> None:
    app = await app_factory(catalog(["ok"]))
    alice, bob = await key(app, "alice"), await key(app, "bob")
    async with client_for(app, alice) as a, client_for(app, bob) as b:
        put = await a.put("/env/user/REGION", json={"value": "eu"})
        assert put.json() == {"name": "REGION", "type": "text", "value": "eu"}
        put = await a.put("/env/user/TOKEN", json={"value": "s3cr3t-value", "type": "secret"})
        assert put.json() == {"name": "TOKEN", "type": "secret", "value": None}
        listed = await a.get("/env/user")
        assert listed.json() == {
            "env": {"REGION": "eu", "TOKEN": None},
            "env_types": {"REGION": "text", "TOKEN": "secret"},
        }
        assert (await a.get("/env/user/TOKEN")).json() == {"name": "TOKEN", "type": "secret", "value": None}
        assert "s3cr3t-value" not in listed.text
        assert (await b.get("/env/user")).json() == {"env": {}, "env_types": {}}
        assert (await b.get("/env/user/REGION")).status_code == 404
        assert (await b.delete("/env/user/REGION")).status_code == 404
        assert (await a.delete("/env/user/REGION")).status_code == 200
        assert (await a.delete("/env/user/REGION")).status_code == 404
        assert list((await a.get("/env/user")).json()["env"]) == ["TOKEN"]
        assert (await a.put("/env/user/REGION", json={"value": "us", "type": "secret"})).json()["value"] is None
        assert (await a.put("/env/user/REGION", json={"value": "us"})).json()["value"] == "us"  # back to text
        assert_error(await a.put("/env/user/1BAD", json={"value": "x"}), 422, "invalid_variable_name")
        assert_error(await a.put("/env/user/A-B", json={"value": "x"}), 422, "invalid_variable_name")
        assert (await a.put("/env/user/OK", json={"value": "a\x00b"})).status_code == 422
        assert (await a.put("/env/user/OK", json={"value": "x", "type": "public"})).status_code == 422
        assert (await a.put("/env/user/OK", json={"value": 3})).status_code == 422
    async with client_for(app) as anonymous:
        assert (await anonymous.get("/env/user")).status_code == 401


async def test_instance_env_routes_are_for_admin_keys(app_factory: Any) -> None:
    app = await app_factory(catalog(["ok"]))
    alice, admin = await key(app, "alice"), await key(app, "root", admin=True)
    async with client_for(app, alice) as a, client_for(app, admin) as root:
        for response in (
            await a.get("/env/instance"),
            await a.put("/env/instance/X", json={"value": "v"}),
            await a.delete("/env/instance/X"),
            await a.get("/env/instance/X"),
        ):
            assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
        assert (await root.put("/env/instance/X", json={"value": "v"})).status_code == 200
        assert (await root.put("/env/instance/S", json={"value": "inst-s3cret", "type": "secret"})).status_code == 200
        listed = (await root.get("/env/instance")).json()
        assert listed == {"env": {"S": None, "X": "v"}, "env_types": {"S": "secret", "X": "text"}}
        assert (await root.get("/env/user")).json()["env"] == {}  # the admin's own values are another scope
        assert (await root.delete("/env/instance/X")).status_code == 200
        assert (await root.get("/env/instance/X")).status_code == 404


async def test_patch_thread_env_keeps_secrets_secret(app_factory: Any) -> None:
    variables = [{"name": "API_KEY", "type": "secret"}]
    app = await app_factory(catalog(["ok"], variables=variables))
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "agent", "env": {"A": "1"}, "secrets": ["A"]})).json()["id"]
        patched = await client.patch(f"/threads/{tid}", json={"env": {"A": "2", "API_KEY": "k", "B": "b"}})
        assert patched.status_code == 200, patched.text
        assert patched.json()["env"] == {"A": None, "API_KEY": None, "B": "b"}
        assert patched.json()["env_types"] == {"A": "secret", "API_KEY": "secret", "B": "text"}
        patched = await client.patch(f"/threads/{tid}", json={"env": {"C": "c"}, "secrets": ["C"], "env_delete": ["B"]})
        assert patched.json()["env"] == {"A": None, "API_KEY": None, "C": None}
        assert (await client.patch(f"/threads/{tid}", json={"secrets": ["Z"]})).status_code == 400
        replaced = await client.patch(f"/threads/{tid}", json={"env_delete": ["A"], "env": {"A": "3"}})
        assert replaced.json()["env"]["A"] is None and replaced.json()["env_types"]["A"] == "secret"


# -- names and limits -----------------------------------------------------------------------------------------

BAD_NAMES = ("bad name!", "", "1X", "A-B", "é", "N" * 129, "N" * 300)


async def pending_request(app: FastAPI, tid: str) -> str:
    """A variable request of the thread, as a subagent creation waiting for values stores one (§6.7)."""
    async with app.state.runtime.sessions() as s, s.begin():
        parent = await threads.lock(s, uuid.UUID(tid))
        creation = children.Creation("agent", ToolEntry(name="agent"), "a", "hi", blocking=False)
        row = await variable_requests.create(s, app.state.runtime.fernet, parent, "agent", [], [], creation)
    return str(row.id)


async def test_a_waiting_creation_keeps_its_secret_scoped_values_encrypted(app_factory: Any) -> None:
    """A fan-out instance waiting for variables holds values read from secrets: stored sealed, read back whole."""
    app = await app_factory(catalog(["ok"]))
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    creation = children.Creation(
        "agent",
        ToolEntry(name="agent"),
        "a",
        "hi",
        blocking=False,
        scoped_env={"TOKEN": "s3cret-value", "REGION": "eu"},
        scoped_secret=["TOKEN"],
    )
    async with app.state.runtime.sessions() as s, s.begin():
        parent = await threads.lock(s, uuid.UUID(tid))
        row = await variable_requests.create(s, app.state.runtime.fernet, parent, "agent", [], [], creation)
    async with app.state.runtime.sessions() as s:
        stored = await s.execute(select(tables.VariableRequest.payload).where(tables.VariableRequest.id == row.id))
        payload = stored.scalar_one()
    assert "s3cret-value" not in json.dumps(payload) and payload["scoped_env"]["REGION"] == "eu"
    assert children.Creation.of(payload, app.state.runtime.fernet) == creation


async def test_a_bad_variable_name_is_refused_alike_wherever_names_enter(app_factory: Any) -> None:
    """One rule for names (an identifier of at most 128 characters) on every route a name enters by: a clear 422,
    the same for each, and nothing written."""
    app = await app_factory(catalog(["ok"]))
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        request_id = await pending_request(app, tid)
        for name in BAD_NAMES:
            responses = [
                await client.post("/threads", json={"agent": "agent", "env": {name: "v"}}),
                await client.patch(f"/threads/{tid}", json={"env": {name: "v"}}),
                await client.post(f"/threads/{tid}/variables/{request_id}", json={"env": {name: "v"}}),
            ]
            if name:  # a path segment is never empty
                responses.append(await client.put(f"/env/user/{quote(name)}", json={"value": "v"}))
            found = [assert_error(response, 422, "invalid_variable_name") for response in responses]
            assert len({e["message"] for e in found}) == 1, found
            assert "letters, digits and `_`" in found[0]["message"] and "128" in found[0]["message"]
        assert [t["id"] for t in (await client.get("/threads")).json()["threads"]] == [tid]
        assert (await client.get(f"/threads/{tid}")).json()["env"] == {}
        assert (await client.get(f"/threads/{tid}/variables/{request_id}")).json()["status"] == "pending"
        assert (await client.get("/env/user")).json()["env"] == {}
        longest = "N" * 128
        assert (await client.patch(f"/threads/{tid}", json={"env": {longest: "v"}})).json()["env"] == {longest: "v"}


async def test_env_is_bounded_in_count_and_value_size(app_factory: Any) -> None:
    """`ENV_MAX_VARIABLES` values per thread (and user, and instance), `ENV_MAX_VALUE_BYTES` per value: more is a
    413 naming the limit, and nothing is written."""
    app = await app_factory(catalog(["ok"]), env_max_variables=3, env_max_value_bytes=8)
    async with client_for(app) as client:
        four = {"A": "1", "B": "2", "C": "3", "D": "4"}
        too_many = await client.post("/threads", json={"agent": "agent", "env": four})
        error = assert_error(too_many, 413, "too_many_variables")
        assert "at most 3 variables" in error["message"] and "ENV_MAX_VARIABLES" in error["message"]
        assert error["details"] == {"limit": 3, "count": 4}
        wide = {"agent": "agent", "env": {"A": "é" * 5}}  # 5 characters, 10 bytes
        error = assert_error(await client.post("/threads", json=wide), 413, "variable_too_large")
        assert "`A`" in error["message"] and "8 bytes" in error["message"] and "ENV_MAX_VALUE_BYTES" in error["message"]
        assert error["details"] == {"name": "A", "limit": 8, "bytes": 10}
        assert (await client.get("/threads")).json()["threads"] == []

        tid = (await client.post("/threads", json={"agent": "agent", "env": {"A": "1", "B": "2"}})).json()["id"]
        assert (await client.patch(f"/threads/{tid}", json={"env": {"A": "x", "C": "3"}})).status_code == 200
        assert_error(await client.patch(f"/threads/{tid}", json={"env": {"D": "4"}}), 413, "too_many_variables")
        wide = {"env": {"B": "123456789"}}
        assert_error(await client.patch(f"/threads/{tid}", json=wide), 413, "variable_too_large")
        swapped = await client.patch(f"/threads/{tid}", json={"env": {"D": "4"}, "env_delete": ["A"]})
        assert swapped.status_code == 200 and swapped.json()["env"] == {"B": "2", "C": "3", "D": "4"}
        request_id = await pending_request(app, tid)
        provide = f"/threads/{tid}/variables/{request_id}"
        assert_error(await client.post(provide, json={"env": four}), 413, "too_many_variables")
        # the child would hold the parent's three values and this one
        assert_error(await client.post(provide, json={"env": {"X": "1"}}), 413, "too_many_variables")
        assert (await client.get(provide)).json()["status"] == "pending"
        assert (await client.get(f"/threads/{tid}")).json()["env"] == {"B": "2", "C": "3", "D": "4"}

        for name in "ABC":
            assert (await client.put(f"/env/user/{name}", json={"value": name})).status_code == 200
        assert_error(await client.put("/env/user/D", json={"value": "4"}), 413, "too_many_variables")
        assert_error(await client.put("/env/user/A", json={"value": "123456789"}), 413, "variable_too_large")
        assert (await client.put("/env/user/A", json={"value": "again"})).status_code == 200  # a replacement fits
        assert (await client.get("/env/user")).json()["env"] == {"A": "again", "B": "B", "C": "C"}


async def test_writing_many_values_is_one_statement(sessions: async_sessionmaker[AsyncSession]) -> None:
    fernet = Fernet(Fernet.generate_key())
    async with sessions() as s, s.begin():
        tid = (await threads.create(s, define_agent(name="a", side_a={"prompt": "p"}), keys.OPEN)).id
    values = {f"V{i}": str(i) for i in range(150)}
    async with sessions() as s, s.begin():
        sent: list[str] = []  # SQLAlchemy's, and those sent on the driver's connection directly
        raw = await statements.driver(s)
        raw._conn.add_query_logger(lambda record: sent.append(record.query))
        event.listen(s.sync_session.get_bind(), "before_cursor_execute", lambda *args: sent.append(args[2]))
        await environment.set_thread(s, fernet, tid, values, {"V0"})
        await asyncio.sleep(0)  # query loggers are called soon after
        assert len(sent) == 1, sent[:3]
    async with sessions() as s, s.begin():
        stored = (await environment.layers(s, fernet, tid, keys.OPEN.user_id)).thread
    assert (
        len(stored) == 150
        and stored["V0"] == environment.Value("0", "secret")
        and stored["V9"] == environment.Value("9", "text")
    )


# -- secrets never leave --------------------------------------------------------------------------------------

SECRETS = ("thread-s3cret-111", "user-s3cret-222", "inst-s3cret-333")


async def test_secrets_of_every_level_never_appear(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    script = [
        {"tool_calls": [{"name": "echo"}, {"name": "boom"}]},
        {"error": f"upstream refused key {SECRETS[1]} for {SECRETS[0]}", "status": 400},
    ]
    app = await app_factory(catalog(script))
    admin = await key(app, "local", admin=True)
    async with client_for(app, admin) as client:
        await client.put("/env/user/U_SECRET", json={"value": SECRETS[1], "type": "secret"})
        await client.put("/env/instance/I_SECRET", json={"value": SECRETS[2], "type": "secret"})
        tid, rows = await run(client, drive, env={"T_SECRET": SECRETS[0]}, secrets=["T_SECRET"])
        tool_rows = [m for m in rows if m["role"] == "tool"]
        assert tool_rows[0]["content"] == "*** *** ***"
        assert tool_rows[1]["content"] == "Tool `boom` failed: RuntimeError: cannot connect with ***"
        responses = [
            await client.get(f"/threads/{tid}"),
            await client.get("/threads"),
            await client.get(f"/threads/{tid}/messages", params={"include_silent": True}),
            await client.get(f"/threads/{tid}/logs"),
            await client.get("/env/user"),
            await client.get("/env/user/U_SECRET"),
            await client.get("/env/instance"),
        ]
        logged = (await client.get(f"/threads/{tid}/logs")).json()["logs"]
        assert any("***" in (log["error"] or "") for log in logged)
    async with app.state.runtime.sessions() as session:
        stored = [r.data for r in await events.read(session, uuid.UUID(tid), 0)]
        values = list((await session.execute(select(tables.EnvValue.value))).scalars())
        messages = [(m.content, m.tool_calls) for m in (await session.execute(select(tables.Message))).scalars()]
    assert any(e.get("code") == "llm_error" and "***" in e["message"] for e in stored)
    assert {"event_type": "debug", "data": {"keys": ["***"] * 3, "***": "as a key too"}} in stored
    texts = [r.text for r in responses] + [repr(stored), repr(values), repr(messages), caplog.text]
    for secret in SECRETS:
        for shown in texts:
            assert secret not in shown


async def test_a_worker_keeps_a_threads_layers_until_any_value_changes(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`environment.layers` in a fenced transaction reuses what it read at the version the fence saw; any write to the
    values (a trigger, in the writer's transaction) moves the version on, and the next step reads them again."""
    fernet = Fernet(Fernet.generate_key())
    async with sessions() as s, s.begin():
        tid = (await threads.create(s, define_agent(name="a", side_a={"prompt": "p"}), keys.OPEN)).id

    async def version() -> int:
        async with sessions() as s:
            return int((await s.execute(text("SELECT value FROM counters WHERE name = 'env'"))).scalar_one())

    async def layers(at: int | None) -> environment.Layers:
        async with sessions() as s, s.begin():
            s.info[queue.ENV_VERSION] = at
            return await environment.layers(s, fernet, tid, keys.OPEN.user_id)

    before = await version()
    assert (await layers(before)).thread == {}
    async with sessions() as s, s.begin():
        await environment.set_thread(s, fernet, tid, {"X": "1"}, set())
        async with sessions() as other, other.begin():  # the counter is taken at commit only: it orders no lock
            locked = "SELECT value FROM counters WHERE name = 'env' FOR UPDATE NOWAIT"
            assert (await other.execute(text(locked))).scalar_one() == before
    after = await version()
    assert after > before
    assert (await layers(before)).thread == {}  # kept: read at that version
    got = await layers(after)
    assert got.thread == {"X": environment.Value("1", "text")}
    got.thread["X"] = environment.Value("changed by a tool", "text")  # a step's own copy
    assert (await layers(after)).thread == {"X": environment.Value("1", "text")}
    async with sessions() as s, s.begin():
        await environment.delete_thread(s, tid, ["X"])
    assert await version() > after and (await layers(await version())).thread == {}
