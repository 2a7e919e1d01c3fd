"""The HTTP contract: status codes and the error envelope of every route, on real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event

from app import __version__, catalog, keys
from app.catalog import Catalog
from app.spec import define_agent, define_model, define_prompt
from tests.conftest import ROOT, client_for, wait_for


def _catalog() -> Catalog:
    base = catalog.load(ROOT / "agents")
    model = define_model(name="slow", provider="test", script=["hello there"], chunk_size=2)
    prompt = define_prompt(
        name="needs_var",
        tool_description="t",
        model="slow",
        prompt="x",
        variables=[
            {"name": "API_TOKEN", "type": "secret", "required": True},
            {"name": "REGION", "required": True},
        ],
    )
    agent = define_agent(name="needs_var", side_a={"prompt": "needs_var"})
    return Catalog(
        root=base.root,
        models={**base.models, "slow": model},
        prompts={**base.prompts, "needs_var": prompt},
        agents={**base.agents, "needs_var": agent},
        tools=base.tools,
    )


@pytest.fixture
async def app(app_factory: Any) -> FastAPI:
    result: FastAPI = await app_factory(_catalog())
    return result


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(app) as c:
        yield c


async def _key(app: FastAPI, user: str, admin: bool = False) -> str:
    async with app.state.runtime.sessions() as s, s.begin():
        _, key = await keys.create(s, user, admin)
    return key


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, dict[str, Any]] = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]
    assert "Traceback" not in response.text
    return body["error"]


async def test_health_ready_openapi(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok", "version": __version__}
    for path in ("/health", "/ready"):  # uptime checkers that ask with HEAD
        head = await client.head(path)
        assert head.status_code == 200 and head.content == b"", path
    assert (await client.get("/ready")).json() == {"status": "ready"}
    spec = (await client.get("/openapi.json")).json()
    for path in (
        "/threads",
        "/threads/{thread_id}",
        "/threads/{thread_id}/messages",
        "/threads/{thread_id}/messages/{message_id}",
        "/threads/{thread_id}/events",
        "/agents",
    ):
        assert path in spec["paths"]
    body = spec["paths"]["/threads/{thread_id}/messages"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert body["application/json"]["schema"]["$ref"].split("/")[-1] in spec["components"]["schemas"]


async def test_ready_is_503_when_migrations_are_behind(client: httpx.AsyncClient, app: FastAPI) -> None:
    async with app.state.runtime.db.begin() as conn:
        await conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0001'")
    assert_error(await client.get("/ready"), 503, "schema_behind")


async def test_agents(client: httpx.AsyncClient) -> None:
    listed = {a["name"]: a for a in (await client.get("/agents")).json()}
    assert listed["assistant"]["type"] == "ai_human"
    assert {v["name"] for v in listed["needs_var"]["variables"]} == {"API_TOKEN", "REGION"}
    assert {v["description"] for v in listed["needs_var"]["variables"]} == {""}  # the spec's "" when not provided
    detail = (await client.get("/agents/assistant")).json()
    assert detail["side_a"]["prompt"] == "assistant" and detail["prompts"] == ["assistant"]
    assert_error(await client.get("/agents/nope"), 404, "agent_not_found")


async def test_an_agent_detail_draws_its_shape(client: httpx.AsyncClient) -> None:
    """`GET /agents/launch`: each side's stop rules and session tools, and each prompt it runs (the polisher, a
    subprompt, too) with its model and its tools by kind, subagents with their modes."""
    launch = (await client.get("/agents/launch")).json()
    assert launch["max_session_turns"] == 4 and launch["hooks"] == []
    assert launch["side_a"] == {
        "label": "Lead",
        "prompt": "launch_lead",
        "stop_on_response": True,
        "stop_tool": None,
        "max_steps": None,
        "session_tools": {},
    }
    assert launch["side_b"]["session_tools"] == {"stop": "accept"}
    prompts = {p["name"]: p for p in launch["prompt_details"]}
    assert [p["name"] for p in launch["prompt_details"]] == ["launch_client", "launch_lead", "polish"]
    lead = prompts["launch_lead"]
    assert lead["model"] == "launch_team" and lead["include_chat"] and lead["description"]
    tools = {t["name"]: t for t in lead["tools"]}
    assert tools["qa_team"] == {
        "name": "qa_team",
        "kind": "subagent",
        "description": "A worker drafts, a reviewer approves (with the file) or rejects.",
        "optional": None,
        "blocking": True,
        "resumable": False,
        "immediate": False,
    }
    assert (tools["researcher"]["blocking"], tools["researcher"]["resumable"]) == (False, True)
    assert (tools["publisher"]["optional"], tools["polish"]["kind"], tools["polish"]["blocking"]) == (
        "PUBLISH",
        "subprompt",
        None,
    )
    worker = (await client.get("/agents/qa_team")).json()  # a subagent's own map
    assert {t["name"]: t["kind"] for p in worker["prompt_details"] for t in p["tools"]} == {"write_draft": "tool"}
    assert worker["side_b"]["session_tools"] == {"stop": "approve", "fail": "reject"}


async def test_an_agent_detail_names_handoffs_includes_and_prompt_hooks(app_factory: Any) -> None:
    """An `ai_human` agent offered as a tool is a handoff; a prompt's own `hooks` replace the agent's for it; the
    prompts whose text a prompt includes are named."""
    base = _catalog()
    billing = define_agent(
        name="billing", side_a={"prompt": "needs_var"}, expose_as_tool=True, tool_description="Billing desk."
    )
    desk = define_prompt(
        name="desk",
        model="slow",
        prompt=[{"type": "text", "content": "Front desk. "}, {"type": "include", "prompt": "needs_var"}],
        tools=["billing", "calculate"],
        hooks=[],
    )
    front = define_agent(name="front", side_a={"prompt": "desk"}, hooks=["audit"])
    cat = dataclasses.replace(
        base, prompts={**base.prompts, "desk": desk}, agents={**base.agents, "billing": billing, "front": front}
    )
    async with client_for(await app_factory(cat)) as client:
        detail = (await client.get("/agents/front")).json()
    [prompt] = detail["prompt_details"]
    assert detail["hooks"] == ["audit"] and prompt["hooks"] == [] and prompt["includes"] == ["needs_var"]
    assert [(t["name"], t["kind"], t["description"], t["blocking"]) for t in prompt["tools"]] == [
        ("billing", "handoff", "Billing desk.", None),
        ("calculate", "tool", "Evaluate an arithmetic expression and return the result.", None),
    ]


async def test_an_absolute_icon_path_is_a_full_url_in_responses(app_factory: Any) -> None:
    """Spec `AgentDefinition.icon`: absolute paths are converted to full URLs in API responses — on the request's
    base URL, or on `PUBLIC_URL` when set; URLs, relative paths and other text stay as they are."""
    base = _catalog()
    icons = {
        "boss": "/icons/boss.svg",
        "web": "https://example.com/icon.svg",
        "cdn": "//cdn.example.com/i.svg",
        "rel": "icons/rel.svg",
        "emoji": "🧪",
    }
    agents = {name: define_agent(name=name, side_a={"prompt": "needs_var"}, icon=icon) for name, icon in icons.items()}
    cat = dataclasses.replace(base, agents={**base.agents, **agents})
    expected = {**icons, "boss": "http://localhost/icons/boss.svg"}
    async with client_for(await app_factory(cat)) as client:
        listed = {a["name"]: a["icon"] for a in (await client.get("/agents")).json()}
        assert {name: listed[name] for name in icons} == expected
        assert listed["assistant"] is None
        for name, icon in expected.items():
            assert (await client.get(f"/agents/{name}")).json()["icon"] == icon
    app = await app_factory(cat, public_url="https://agents.example.com/api/")
    async with client_for(app) as client:
        listed = {a["name"]: a["icon"] for a in (await client.get("/agents")).json()}
        assert listed["boss"] == "https://agents.example.com/api/icons/boss.svg" and listed["rel"] == "icons/rel.svg"
        detail = (await client.get("/agents/boss")).json()
        assert detail["icon"] == "https://agents.example.com/api/icons/boss.svg"


@contextlib.contextmanager
def statements_sent(app: FastAPI) -> Iterator[list[str]]:
    """Every statement the app's pool sends meanwhile: plain SQL (asyncpg's query loggers) and SQLAlchemy's own
    (prepared: asyncpg logs none)."""
    sent: list[str] = []
    engine = app.state.runtime.db.sync_engine

    def logged(record: Any) -> None:
        sent.append(record.query)

    def checkout(dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(logged)  # a set: added once per connection

    def executed(conn: Any, cursor: Any, sql: str, *_: Any) -> None:
        sent.append(sql)

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "before_cursor_execute", executed)
    try:
        yield sent
    finally:
        event.remove(engine, "checkout", checkout)
        event.remove(engine, "before_cursor_execute", executed)


async def test_create_thread_errors(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/threads", json={"agent": "nope"}), 404, "agent_not_found")
    missing = assert_error(await client.post("/threads", json={"agent": "needs_var"}), 422, "missing_variables")
    assert missing["details"]["missing"] == ["API_TOKEN", "REGION"]
    assert_error(
        await client.post("/threads", content=b"{not json", headers={"content-type": "application/json"}),
        400,
        "malformed_json",
    )
    assert_error(await client.post("/threads", json={"agent": "assistant", "colour": "red"}), 422, "invalid_request")
    assert_error(await client.post("/threads", json={}), 422, "invalid_request")
    assert_error(await client.post("/threads", json={"agent": "assistant", "secrets": ["X"]}), 400, "invalid_request")


async def test_create_thread_with_env_masks_secrets(client: httpx.AsyncClient) -> None:
    body = {
        "agent_id": "needs_var",
        "env": {"API_TOKEN": "s3cr3t", "REGION": "eu"},
        "tags": ["a"],
        "name": "n",
    }
    response = await client.post("/threads", json=body)
    assert response.status_code == 201, response.text
    thread = response.json()
    assert thread["env"] == {"API_TOKEN": None, "REGION": "eu"}
    assert thread["env_types"] == {"API_TOKEN": "secret", "REGION": "text"}
    assert "s3cr3t" not in response.text and "s3cr3t" not in (await client.get(f"/threads/{thread['id']}")).text
    assert thread["status"] == "idle" and thread["tags"] == ["a"] and thread["name"] == "n"


async def test_a_threads_lifecycle_event_is_the_last_statement_before_its_commit(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    """Creating, changing, stopping a thread: its lifecycle event locks the lifecycle log's one counter row until the
    commit (every such request takes that lock in turn), so it is the transaction's last statement."""
    with statements_sent(app) as sent:
        created = await client.post("/threads", json={"agent": "assistant", "env": {"A": "1"}})
        tid = created.json()["id"]
        assert (await client.patch(f"/threads/{tid}", json={"name": "n", "env": {"B": "2"}})).status_code == 200
        assert (await client.post(f"/threads/{tid}/stop")).status_code == 200
        assert (await client.post(f"/threads/{tid}/continue")).status_code == 202
    counted = [i for i, sql in enumerate(sent) if "UPDATE counters" in sql]
    assert len(counted) == 4
    assert all(sent[i + 1].strip().upper().startswith("COMMIT") for i in counted), [sent[i + 1][:40] for i in counted]


async def test_secrets_are_encrypted_at_rest(client: httpx.AsyncClient, app: FastAPI) -> None:
    body = {"agent": "assistant", "env": {"TOKEN": "plain-secret-value"}, "secrets": ["TOKEN"]}
    assert (await client.post("/threads", json=body)).status_code == 201
    async with app.state.runtime.db.connect() as conn:
        stored = (await conn.exec_driver_sql("SELECT value FROM env_values")).scalar_one()
    assert "plain-secret-value" not in stored


async def test_thread_listings_carry_env_names_and_types_not_values(client: httpx.AsyncClient) -> None:
    """A listing's threads show what env they hold (`env_types`) but not the values (`env` is null): a listing
    stays small whatever the values; one thread's own `GET` shows its text values."""
    big = "v" * 60_000
    body = {"agent": "assistant", "env": {"BIG": big, "S": "s3cret"}, "secrets": ["S"]}
    tid = (await client.post("/threads", json=body)).json()["id"]
    listed = await client.get("/threads")
    [item] = listed.json()["threads"]
    assert item["id"] == tid and item["env"] is None and item["env_types"] == {"BIG": "text", "S": "secret"}
    assert big not in listed.text and len(listed.content) < 5_000
    assert (await client.get(f"/threads/{tid}")).json()["env"] == {"BIG": big, "S": None}


async def test_list_threads_paginates_newest_first(client: httpx.AsyncClient) -> None:
    ids = [
        (await client.post("/threads", json={"agent": "assistant", "tags": [f"t{i}"]})).json()["id"] for i in range(5)
    ]
    page1 = (await client.get("/threads", params={"limit": 2})).json()
    page2 = (await client.get("/threads", params={"limit": 2, "cursor": page1["next_cursor"]})).json()
    page3 = (await client.get("/threads", params={"limit": 2, "cursor": page2["next_cursor"]})).json()
    got = [t["id"] for p in (page1, page2, page3) for t in p["threads"]]
    assert got == ids[::-1] and page3["next_cursor"] is None
    assert [t["id"] for t in (await client.get("/threads", params={"tag": "t3"})).json()["threads"]] == [ids[3]]
    assert len((await client.get("/threads", params={"parent_id": "none"})).json()["threads"]) == 5
    assert_error(await client.get("/threads", params={"cursor": "garbage"}), 400, "bad_cursor")
    assert_error(await client.get("/threads", params={"limit": 0}), 422, "invalid_request")
    assert_error(await client.get("/threads", params={"parent_id": "x"}), 422, "invalid_request")


async def test_a_listing_reads_every_listed_threads_extras_at_once(app: FastAPI, client: httpx.AsyncClient) -> None:
    """`GET /threads` reads each thread's extras (children counts, env types) for the whole page in one query each:
    a longer page costs no more sent."""

    async def listing() -> int:
        with statements_sent(app) as sent:
            assert (await client.get("/threads")).status_code == 200
        return len(sent)

    first = (await client.post("/threads", json={"agent": "assistant", "env": {"A": "1"}})).json()["id"]
    one = await listing()
    for i in range(4):
        body = {"agent": "assistant", "env": {f"V{i}": "x"}, "secrets": [f"V{i}"]}
        assert (await client.post("/threads", json=body)).status_code == 201
    async with app.state.runtime.db.begin() as conn:  # children, as a subagent call would make them
        await conn.exec_driver_sql(f"UPDATE threads SET parent_id = '{first}' WHERE id <> '{first}'")
    listed = (await client.get("/threads")).json()["threads"]
    assert len(listed) == 5 and {t["children_count"] for t in listed if t["id"] == first} == {4}
    assert one >= 3 and await listing() == one  # the threads, their children counts, their env types


async def test_thread_not_found(client: httpx.AsyncClient) -> None:
    missing = uuid.uuid4()
    assert_error(await client.get(f"/threads/{missing}"), 404, "thread_not_found")
    assert_error(await client.get(f"/threads/{missing}/messages"), 404, "thread_not_found")
    assert_error(await client.post(f"/threads/{missing}/messages", json={"content": "x"}), 404, "thread_not_found")
    assert_error(await client.get(f"/threads/{missing}/events"), 404, "thread_not_found")
    assert_error(await client.get("/threads/not-a-uuid"), 422, "invalid_request")
    assert_error(await client.get("/nowhere"), 404, "not_found")
    assert_error(await client.delete("/health"), 405, "method_not_allowed")


async def test_post_and_list_messages(client: httpx.AsyncClient) -> None:
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    posted = await client.post(f"/threads/{tid}/messages", json={"content": "hello", "metadata": {"k": 1}})
    assert posted.status_code == 202 and posted.json()["status"] == "queued"
    message_id = posted.json()["message_id"]
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "queued"
    listed = (await client.get(f"/threads/{tid}/messages")).json()
    assert [(m["id"], m["status"], m["metadata"]) for m in listed["messages"]] == [
        (message_id, "pending", {"k": 1, "queued": True})
    ]
    assert_error(await client.get(f"/threads/{tid}/messages/{uuid.uuid4()}"), 404, "message_not_found")
    assert_error(
        await client.post(f"/threads/{tid}/messages", json={"content": "x", "role": "robot"}),
        422,
        "invalid_request",
    )
    assert_error(
        await client.post(f"/threads/{tid}/messages", content=b"x", headers={"content-type": "text/plain"}),
        415,
        "unsupported_media_type",
    )
    assert_error(await client.get(f"/threads/{tid}/messages", params={"cursor": "zz"}), 400, "bad_cursor")


async def test_posting_to_a_terminated_thread_conflicts(client: httpx.AsyncClient, app: FastAPI) -> None:
    tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    async with app.state.runtime.db.begin() as conn:
        await conn.exec_driver_sql(f"UPDATE threads SET terminated_at = now() WHERE id = '{tid}'")
    assert_error(await client.post(f"/threads/{tid}/messages", json={"content": "x"}), 409, "thread_terminated")


async def test_keys_and_ownership(app: FastAPI) -> None:
    alice, bob, admin = await _key(app, "alice"), await _key(app, "bob"), await _key(app, "root", admin=True)
    async with (
        client_for(app) as anon,
        client_for(app, alice) as a,
        client_for(app, bob) as b,
        client_for(app, admin) as root,
        client_for(app, "sa_wrong") as wrong,
    ):
        assert_error(await anon.get("/threads"), 401, "unauthorized")  # keys exist: open mode is over
        assert_error(await wrong.get("/threads"), 401, "unauthorized")
        bad_scheme = await anon.get("/threads", headers={"Authorization": "Basic abc"})
        assert_error(bad_scheme, 401, "unauthorized")
        assert (await anon.get("/health")).status_code == 200
        tid = (await a.post("/threads", json={"agent": "assistant"})).json()["id"]
        assert (await a.get(f"/threads/{tid}")).json()["user_id"] == "alice"
        assert_error(await b.get(f"/threads/{tid}"), 404, "thread_not_found")
        assert_error(await b.post(f"/threads/{tid}/messages", json={"content": "hi"}), 404, "thread_not_found")
        assert_error(await b.get(f"/threads/{tid}/messages"), 404, "thread_not_found")
        assert_error(await b.get(f"/threads/{tid}/events"), 404, "thread_not_found")
        assert (await b.get("/threads")).json()["threads"] == []
        assert (await root.get(f"/threads/{tid}")).status_code == 200
        assert [t["id"] for t in (await root.get("/threads")).json()["threads"]] == [tid]


async def test_a_keyed_message_takes_one_connection_per_request(app_factory: Any) -> None:
    """With a key, the caller is looked up in the request's transaction, and the message is queued in it: a second
    connection taken meanwhile would wait forever on a full pool (here, a pool of one)."""
    app = await app_factory(catalog.load(ROOT / "agents"), db_pool_size=1)
    key = await _key(app, "dora")
    async with client_for(app, key) as c:
        tid = (await c.post("/threads", json={"agent": "assistant"})).json()["id"]
        posts = [c.post(f"/threads/{tid}/messages", json={"content": f"m{i}"}) for i in range(3)]
        answers = await asyncio.wait_for(asyncio.gather(*posts), 10)
        assert [a.status_code for a in answers] == [202, 202, 202]
        queued = (await c.get(f"/threads/{tid}/messages")).json()["messages"]
        assert sorted(m["content"] for m in queued) == ["m0", "m1", "m2"]
        assert (await c.get(f"/threads/{tid}")).json()["status"] == "queued"


async def test_revoked_key_is_refused(app: FastAPI) -> None:
    key = await _key(app, "carol")
    async with app.state.runtime.sessions() as s, s.begin():
        assert await keys.revoke(s, key[:10]) == 1
    async with client_for(app, key) as c:
        assert_error(await c.get("/threads"), 401, "unauthorized")


async def test_open_mode_counts_keys_once_per_change(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    counted: list[int] = []
    real = keys.active_count

    async def counting(session: Any) -> int:
        counted.append(found := await real(session))
        return found

    monkeypatch.setattr(keys, "active_count", counting)
    async with client_for(app) as anon:
        for _ in range(3):
            assert (await anon.get("/threads")).status_code == 200
        assert counted == [0]  # counted once: nothing changed since
        key = await _key(app, "dave")  # a trigger announces it; the hub hears it moments after the commit

        async def refused() -> bool:
            return (await anon.get("/threads")).status_code == 401

        await wait_for(refused, interval=0.01)
        async with app.state.runtime.sessions() as s, s.begin():
            assert await keys.revoke(s, key[:10]) == 1

        async def open_again() -> bool:
            return (await anon.get("/threads")).status_code == 200

        await wait_for(open_again, interval=0.01)  # no key left: open mode is back

        async def counted_no_more() -> bool:  # the revoke's notification may arrive after the count that reopened
            counted.clear()
            return (await anon.get("/threads")).status_code == 200 and counted == []

        await wait_for(counted_no_more, interval=0.01)


async def test_open_mode_is_off_beyond_loopback(app_factory: Any) -> None:
    app = await app_factory(_catalog(), host="0.0.0.0")
    async with client_for(app) as c:
        assert_error(await c.get("/threads"), 401, "unauthorized")


async def test_open_mode_serves_only_hosts_of_this_machine(app_factory: Any, serve: Any) -> None:
    """A page that rebinds its own name to 127.0.0.1 still sends that name: open mode refuses it (DNS rebinding)."""
    app = await app_factory(_catalog(), allowed_hosts=["agents.internal", "box.lan"])
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base) as c:
        for host in ("localhost", "localhost:8000", "127.0.0.1", "[::1]:8000", "app.localhost", "agents.internal"):
            assert (await c.get("/threads", headers={"host": host})).status_code == 200, host
        assert (await c.get("/threads", headers={"host": "box.lan:9"})).status_code == 200
        refused = ("evil.example.com", "evil.example.com:8000", "127.0.0.1.evil.example", "localhost.evil")
        unparsable = ("evil.example.com:99999", "ev{il}.example.com", "localhost:80:80", "")  # Starlette: 127.0.0.1
        for host in (*refused, *unparsable):
            response = await c.get("/threads", headers={"host": host})
            assert_error(response, 403, "host_not_allowed")
            assert (await c.post("/threads", json={"agent": "assistant"}, headers={"host": host})).status_code == 403
        assert (await c.get("/threads")).json()["threads"] == []
        assert (await c.get("/health", headers={"host": "evil.example.com"})).status_code == 200  # no data there


async def test_cors_lets_the_listed_origins_call_every_route(app_factory: Any, serve: Any) -> None:
    """A page on another origin: preflights answered, every answer (errors and streams too) carries the origin;
    an origin not listed gets nothing it could read."""
    page = "http://127.0.0.1:18050"
    app = await app_factory(_catalog(), cors_origins=[page])
    base = await serve(app)
    origin = {"Origin": page}
    async with httpx.AsyncClient(base_url=base, timeout=10) as c:
        headers = "authorization,content-type,x-client"  # `X-Client`: the JS client's version, in a browser
        asks = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": headers}
        preflight = await c.options("/threads", headers={**origin, **asks})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == page
        allowed = {h.lower() for h in preflight.headers["access-control-allow-headers"].split(", ")}
        assert {"authorization", "content-type", "last-event-id", "x-client"} <= allowed
        created = await c.post("/threads", json={"agent": "assistant"}, headers=origin)
        assert created.status_code == 201 and created.headers["access-control-allow-origin"] == page
        tid = created.json()["id"]
        async with c.stream("GET", f"/threads/{tid}/events", headers=origin) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert stream.headers["access-control-allow-origin"] == page
        missing = await c.get(f"/threads/{uuid.uuid4()}", headers=origin)
        assert missing.status_code == 404 and missing.headers["access-control-allow-origin"] == page
        evil = {"Origin": "https://evil.example"}
        assert "access-control-allow-origin" not in (await c.get("/threads", headers=evil)).headers
        assert (await c.options("/threads", headers={**evil, **asks})).status_code == 400


async def test_no_cors_unless_configured(client: httpx.AsyncClient) -> None:
    asks = {"Origin": "http://127.0.0.1:18050", "Access-Control-Request-Method": "POST"}
    assert (await client.options("/threads", headers=asks)).status_code == 405
    assert "access-control-allow-origin" not in (await client.get("/threads", headers=asks)).headers


# -- the stream, over a real HTTP server (ASGITransport buffers whole responses) ---------------------------


@pytest.fixture
async def served(app_factory: Any, serve: Any) -> tuple[FastAPI, str]:
    """An app with its worker, and the address a real server serves it at."""
    app = await app_factory(_catalog(), with_worker=True)
    return app, str(await serve(app))


async def turn(client: httpx.AsyncClient, tid: str, content: str) -> dict[str, Any]:
    """Post a message and wait for its turn to end (`?wait=`: the server answers then, nothing polls); the thread."""
    posted = await client.post(f"/threads/{tid}/messages", params={"wait": 30}, json={"content": content})
    assert posted.status_code == 200 and posted.json()["done"], posted.text
    thread: dict[str, Any] = (await client.get(f"/threads/{tid}")).json()
    return thread


async def read_events(base: str, path: str, until: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Parse SSE frames until an event of type `until` arrives."""
    out: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    async with (
        httpx.AsyncClient(base_url=base, timeout=10) as client,
        client.stream("GET", path, headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no"
        async for line in response.aiter_lines():
            if not line:
                if "event" in frame:
                    out.append(frame)
                    if frame["event"] == until:
                        return out
                frame = {}
            elif line.startswith(":"):
                continue
            else:
                key, _, value = line.partition(":")
                frame[key] = json.loads(value) if key == "data" else value.strip()
    return out


async def test_events_stream_replays_then_follows(served: tuple[FastAPI, str]) -> None:
    app, base = served
    async with httpx.AsyncClient(base_url=base) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        reader = asyncio.create_task(read_events(base, f"/threads/{tid}/events", "turn_ended"))
        await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 1), interval=0.01)  # subscribed
        await client.post(f"/threads/{tid}/messages", json={"content": "what is 6 * 7?"})
        live = await asyncio.wait_for(reader, 15)
    stored = [f for f in live if "id" in f]
    assert [int(f["id"]) for f in stored] == list(range(1, len(stored) + 1))  # every stored event, in order
    types = [f["event"] for f in live]
    for expected in (
        "message_data",
        "message_chunk",
        "step_started",
        "step_completed",
        "tool_started",
        "tool_completed",
        "thread_status",
        "turn_ended",
    ):
        assert expected in types
    chunks = [f["data"] for f in live if f["event"] == "message_chunk"]
    assert "".join(c["chunk"] for c in chunks) == "The answer is 42."
    assert all("id" not in f for f in live if f["event"] == "message_chunk")
    # resume: Last-Event-ID wins over `since` and replays exactly the stored suffix
    suffix = await read_events(
        base, f"/threads/{tid}/events?since=1", "turn_ended", headers={"Last-Event-ID": stored[4]["id"]}
    )
    assert [f["id"] for f in suffix] == [f["id"] for f in stored[5:]]
