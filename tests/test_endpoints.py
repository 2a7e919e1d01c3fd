"""Custom thread endpoints: file names to routes, matching, load errors, and dispatch over HTTP (`app.routing`,
`app.api.routes.endpoints`)."""

from __future__ import annotations

import logging
import re
import shutil
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from app import catalog, keys, routing
from app.api.app import create_app
from app.settings import Settings
from tests.conftest import ROOT, client_for, wait_for
from tests.test_cli import agents

# -- file names to routes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "route"),
    [
        ("summary.py", "GET /threads/{id}/summary"),
        ("summary.get.py", "GET /threads/{id}/summary"),
        ("note.post.py", "POST /threads/{id}/note"),
        ("a/b-c/d_e.PATCH.py", "PATCH /threads/{id}/a/b-c/d_e"),
        ("reports/index.py", "GET /threads/{id}/reports"),
        ("reports/index.delete.py", "DELETE /threads/{id}/reports"),
        ("index.post.py", "POST /threads/{id}"),
        ("items/[item].put.py", "PUT /threads/{id}/items/[item]"),
        ("[section]/latest.py", "GET /threads/{id}/[section]/latest"),
        ("files/[...rest].py", "GET /threads/{id}/files/[...rest]"),
        ("[...rest].delete.py", "DELETE /threads/{id}/[...rest]"),
    ],
)
def test_file_names_give_routes(file: str, route: str) -> None:
    assert str(routing.parse(file)) == route


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ("summary.fetch.py", "unknown method `fetch`"),
        ("summary.get.json.py", "not an endpoint file name"),
        ("my report.py", "not a valid file name"),
        ("[].py", "not a valid file name"),
        ("[a-b].py", "not a valid file name"),
        ("[...rest]/more.py", "catch-all folder `[...rest]` is not last"),
        ("[id]/[id].py", "parameter `id` appears twice"),
        ("bad folder/x.py", "not a valid folder name"),
    ],
)
def test_bad_file_names_are_refused(file: str, message: str) -> None:
    with pytest.raises(routing.RouteError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
        routing.parse(file)
    assert caught.value.fix


def router(*files: str) -> routing.Router[str]:
    built, problems = routing.build({f: f for f in files})
    assert problems == []
    return built


def resolve(r: routing.Router[str], method: str, path: str) -> tuple[str | None, dict[str, str]] | None:
    found = r.match(method, path)
    return None if found is None else (found.endpoint, found.params)


def test_static_beats_dynamic_beats_catch_all() -> None:
    r = router("reports/latest.py", "reports/[id].py", "reports/[...rest].py", "reports/index.py")
    assert resolve(r, "GET", "reports/latest") == ("reports/latest.py", {})
    assert resolve(r, "GET", "reports/42") == ("reports/[id].py", {"id": "42"})
    assert resolve(r, "GET", "reports/2024/q4/summary") == ("reports/[...rest].py", {"rest": "2024/q4/summary"})
    assert resolve(r, "GET", "reports") == ("reports/index.py", {})
    assert resolve(r, "GET", "reports/") == ("reports/index.py", {})
    assert resolve(r, "GET", "other") is None


def test_precedence_is_per_segment_from_the_left() -> None:
    r = router("[section]/b.py", "a/[...rest].py", "[x]/[y].py")
    assert resolve(r, "GET", "a/b") == ("a/[...rest].py", {"rest": "b"})  # static `a` first, though `b` is static
    assert resolve(r, "GET", "z/b") == ("[section]/b.py", {"section": "z"})
    assert resolve(r, "GET", "z/q") == ("[x]/[y].py", {"x": "z", "y": "q"})


def test_a_catch_all_needs_one_segment_or_more() -> None:
    r = router("files/[...rest].py")
    assert resolve(r, "GET", "files") is None
    assert resolve(r, "GET", "files/a") == ("files/[...rest].py", {"rest": "a"})


def test_methods_by_suffix_and_what_a_path_allows() -> None:
    r = router("item.py", "item.delete.py", "[name].post.py")
    assert resolve(r, "GET", "item") == ("item.py", {})
    assert resolve(r, "DELETE", "item") == ("item.delete.py", {})
    assert resolve(r, "POST", "item") == ("[name].post.py", {"name": "item"})  # the best route *of the method*
    wrong = r.match("PUT", "item")
    assert wrong is not None and wrong.endpoint is None and wrong.allow == ("GET", "POST", "DELETE")


def test_built_in_paths_and_duplicates_are_refused() -> None:
    files = [
        "messages.post.py",
        "messages/stats.py",
        "fs/[...rest].py",
        "effects/[id]/cancel.post.py",
        "index.py",
        "index.patch.py",
        "index.post.py",  # no built-in `POST /threads/{id}`
        "[name].py",  # built-in routes win for their names, this gets the others
        "a.py",
        "a.get.py",
        "[id].delete.py",
        "[key].delete.py",
    ]
    built, problems = routing.build({f: f for f in files})
    refused = {file: exc.message for file, exc in problems}
    assert sorted(refused) == sorted(
        [
            "messages.post.py",
            "messages/stats.py",
            "fs/[...rest].py",
            "effects/[id]/cancel.post.py",
            "index.py",
            "index.patch.py",
            "a.py",  # sorted after `a.get.py`, so it is the second of the two
            "[key].delete.py",
        ]
    )
    assert refused["messages.post.py"] == "`POST /threads/{id}/messages` is a built-in thread route"
    assert refused["a.py"] == "`GET /threads/{id}/a` is also defined by endpoints/a.get.py"
    assert refused["[key].delete.py"] == "`DELETE /threads/{id}/[key]` is also defined by endpoints/[id].delete.py"
    assert sorted(str(r) for r in built.routes) == sorted(
        ["POST /threads/{id}", "GET /threads/{id}/[name]", "GET /threads/{id}/a", "DELETE /threads/{id}/[id]"]
    )


def test_the_reserved_names_cover_every_built_in_thread_route() -> None:
    settings = Settings(database_url="postgresql://nobody@127.0.0.1/none", secret_key="test-" + "k" * 40)
    paths = create_app(settings, catalog.empty()).openapi()["paths"]  # the built-in routes (ours are not in it)
    prefix = "/threads/{thread_id}"
    built_in = {p.removeprefix(prefix): {m.upper() for m in ops} for p, ops in paths.items() if p.startswith(prefix)}
    assert {"", "/messages", "/messages/{message_id}", "/events", "/fs", "/fs/{path}", "/stop"} <= set(built_in)
    for path, methods in built_in.items():
        if path:
            assert routing.split(path)[0] in routing.RESERVED, path
        else:
            assert methods == routing.THREAD_METHODS


@pytest.mark.parametrize(
    ("path", "ours"),
    [
        ("summary", True),
        ("messagesx/a", True),
        ("a/messages", True),
        ("messages", False),
        ("messages/", False),
        ("messages/1", False),
        ("fs/a/b", False),
        ("", False),
    ],
)
def test_paths_starting_with_a_reserved_name_are_never_ours(path: str, ours: bool) -> None:
    assert (re.fullmatch(routing.unreserved_regex(), path) is not None) is ours


# -- loading ------------------------------------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


HEADER = "from app.spec import define_thread_endpoint\n"


def endpoint(body: str = "return {}", decorator: str = "@define_thread_endpoint", name: str = "handler") -> str:
    return f"{HEADER}\n{decorator}\nasync def {name}(request, state, params):\n    {body}\n"


def test_endpoint_files_load_nested_and_helpers_are_skipped(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "endpoints/summary.get.py": endpoint(decorator='@define_thread_endpoint(description="Sum.")'),
            "endpoints/reports/[id].py": endpoint(),
            "endpoints/reports/_helpers.py": "X = 1\n",
            "endpoints/_lib/anything.py": "X = 1\n",
        },
    )
    loaded = catalog.load(tmp_path)
    assert sorted(str(r) for r in loaded.endpoints.routes) == [
        "GET /threads/{id}/reports/[id]",
        "GET /threads/{id}/summary",
    ]
    found = loaded.endpoints.match("GET", "summary")
    assert found is not None and found.endpoint is not None
    assert (found.endpoint.name, found.endpoint.description) == ("summary.get.py", "Sum.")


def test_endpoint_load_errors_name_file_field_and_fix(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "endpoints/messages.py": endpoint(),
            "endpoints/a.py": endpoint(),
            "endpoints/a.get.py": endpoint(),
            "endpoints/b.fetch.py": endpoint(),
            "endpoints/none.py": "X = 1\n",
            "endpoints/two.py": endpoint(name="one") + endpoint(name="two").removeprefix(HEADER),
            "endpoints/sync.py": endpoint().replace("async def", "def"),
            "endpoints/args.py": f"{HEADER}\n@define_thread_endpoint\nasync def handler(state):\n    return 1\n",
        },
    )
    problems = {p.file.removeprefix(f"{tmp_path.name}/"): p for p in catalog.check(tmp_path)}
    assert sorted(problems) == [
        "endpoints/a.py",
        "endpoints/args.py",
        "endpoints/b.fetch.py",
        "endpoints/messages.py",
        "endpoints/none.py",
        "endpoints/sync.py",
        "endpoints/two.py",
    ]
    assert str(problems["endpoints/messages.py"]).endswith(
        "endpoints/messages.py: route: `GET /threads/{id}/messages` is a built-in thread route"
        " — fix: rename the file or its folder (built-in routes always win)"
    )
    assert "also defined by endpoints/a.get.py" in problems["endpoints/a.py"].message
    assert "unknown method `fetch`" in problems["endpoints/b.fetch.py"].message
    assert problems["endpoints/none.py"].message == "defines 0 endpoints"
    assert problems["endpoints/two.py"].message == "defines 2 endpoints"
    assert "must be an `async def` function" in problems["endpoints/sync.py"].message
    assert "must take (request, state, params)" in problems["endpoints/args.py"].message
    with pytest.raises(catalog.CatalogError):
        catalog.load(tmp_path)


def test_agents_check_reports_endpoint_problems(tmp_path: Path) -> None:
    write(tmp_path, {"endpoints/fs/[...rest].put.py": endpoint()})
    result = agents("--agents-dir", str(tmp_path), "check")
    assert result.returncode == 1
    assert "endpoints/fs/[...rest].put.py: route: `PUT /threads/{id}/fs/[...rest]` is a built-in thread route" in (
        result.stdout
    )


# -- over HTTP ----------------------------------------------------------------------------------------------

ENDPOINTS = {
    "endpoints/note.post.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def note(request, state, params):
            body = await request.json()
            return {"queued": await state.queue_message("user", body["text"])}
    """,
    "endpoints/teapot.py": """
        from starlette.responses import PlainTextResponse
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def teapot(request, state, params):
            return PlainTextResponse("short and stout", status_code=418, headers={"X-Pot": "tea"})
    """,
    "endpoints/items/[item].py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def item(request, state, params):
            return {"params": params, "execution": state.execution, "context": state.context,
                    "query": dict(request.query_params)}
    """,
    "endpoints/files/[...rest].py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def files(request, state, params):
            return params
    """,
    "endpoints/[name].put.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def put(request, state, params):
            return params
    """,
    "endpoints/index.post.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def poke(request, state, params):
            return {"poked": state.thread_id}
    """,
    "endpoints/inject.post.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def inject(request, state, params):
            await state.inject_message("user", "sneaky")
    """,
    "endpoints/env/[name].py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def env(request, state, params):
            if request.query_params.get("set"):
                await state.set_env(params["name"], request.query_params["set"])
            return {"value": await state.env(params["name"])}
    """,
    "endpoints/boom.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def boom(request, state, params):
            raise RuntimeError("internal detail 42")
    """,
    "endpoints/opaque.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def opaque(request, state, params):
            return object()
    """,
    "endpoints/echo.post.py": """
        from app.spec import define_thread_endpoint

        @define_thread_endpoint
        async def echo(request, state, params):
            return {"body": (await request.body()).decode(), "type": request.headers.get("content-type")}
    """,
}


async def start(app_factory: Any, tmp_path: Path, **options: Any) -> Any:
    root = tmp_path / "agents"
    shutil.copytree(ROOT / "agents", root, ignore=shutil.ignore_patterns("__pycache__"))
    write(root, ENDPOINTS)
    return await app_factory(catalog.load(root), **options)


async def test_summary_endpoint_reads_the_thread(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path, with_worker=True)
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        empty = await client.get(f"/threads/{tid}/summary")
        assert empty.status_code == 200, empty.text
        assert empty.json() == {"thread_id": tid, "agent": "assistant", "messages": 0, "last_message": None}
        await client.post(f"/threads/{tid}/messages", json={"role": "user", "content": "hello"})

        async def answered() -> Any:
            body = (await client.get(f"/threads/{tid}/summary")).json()
            return body if body["messages"] == 2 and body["last_message"] else None

        body = await wait_for(answered)
        assert body["last_message"].startswith("I am the demo assistant")


async def test_a_post_endpoint_queues_a_message_the_thread_then_runs(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path, with_worker=True)
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        posted = await client.post(f"/threads/{tid}/note", json={"text": "what is 2 + 3?"})
        assert posted.status_code == 200, posted.text
        queued = posted.json()["queued"]

        async def delivered() -> Any:
            rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
            return rows if rows and rows[-1]["content"] == "The answer is 5." else None

        rows = await wait_for(delivered)
        assert (rows[0]["id"], rows[0]["role"], rows[0]["content"]) == (queued, "user", "what is 2 + 3?")


async def test_responses_params_and_methods(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path)
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        teapot = await client.get(f"/threads/{tid}/teapot")
        assert (teapot.status_code, teapot.text, teapot.headers["x-pot"]) == (418, "short and stout", "tea")
        item = (await client.get(f"/threads/{tid}/items/hat?size=9")).json()
        assert item == {"params": {"item": "hat"}, "execution": None, "context": {}, "query": {"size": "9"}}
        rest = (await client.get(f"/threads/{tid}/files/a/b%20c.txt")).json()
        assert rest == {"rest": "a/b c.txt"}
        assert (await client.post(f"/threads/{tid}")).json() == {"poked": tid}
        assert (await client.get(f"/threads/{tid}")).json()["id"] == tid  # the built-in route still answers

        wrong = await client.delete(f"/threads/{tid}/teapot")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, PUT"  # `[name].put.py` matches too
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        for method in ("OPTIONS", "TRACE"):  # methods no endpoint can have: refused as DELETE is, not allowed all
            other = await client.request(method, f"/threads/{tid}/teapot")
            assert other.status_code == 405 and other.headers["allow"] == "GET, PUT", method
        unknown = await client.request("OPTIONS", f"/threads/{tid}/nothing/here")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "endpoint_not_found"
        root = await client.put(f"/threads/{tid}")
        assert root.status_code == 405 and root.headers["allow"] == "GET, POST, PATCH, DELETE"
        assert (await client.put(f"/threads/{tid}/anything")).json() == {"name": "anything"}
        builtin = await client.put(f"/threads/{tid}/messages")  # not `[name].put.py`: built-in routes win
        assert builtin.status_code == 405 and "POST" in builtin.headers["allow"]
        assert (await client.get(f"/threads/{tid}/messages/a/b")).json()["error"]["code"] == "not_found"
        assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []

        missing = await client.get(f"/threads/{tid}/nothing/here")
        assert missing.status_code == 404
        assert missing.json()["error"] == {
            "code": "endpoint_not_found",
            "message": "No endpoint of this thread answers `GET /nothing/here`.",
        }
        unknown = await client.get(f"/threads/{uuid.uuid4()}/teapot")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "thread_not_found"


async def test_state_refuses_own_execution_writes_with_a_clear_error(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path)
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        refused = await client.post(f"/threads/{tid}/inject")
        assert refused.status_code == 409
        error = refused.json()["error"]
        assert error["code"] == "outside_execution"
        assert "only allowed inside the thread's own execution" in error["message"]
        assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []


async def test_state_env_resolves_the_thread_env_and_refuses_set_env(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path)
    async with client_for(app) as client:
        body = {"agent": "assistant", "env": {"COLOR": "blue", "TOKEN": "s3"}, "secrets": ["TOKEN"]}
        tid = (await client.post("/threads", json=body)).json()["id"]
        assert (await client.get(f"/threads/{tid}/env/COLOR")).json() == {"value": "blue"}
        assert (await client.get(f"/threads/{tid}/env/TOKEN")).json() == {"value": "s3"}  # decrypted for the handler
        refused = await client.get(f"/threads/{tid}/env/COLOR?set=red")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "outside_execution"
        assert (await client.get(f"/threads/{tid}/env/COLOR")).json() == {"value": "blue"}


async def test_a_failing_endpoint_is_a_500_without_its_details(
    app_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await start(app_factory, tmp_path)
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        with caplog.at_level(logging.ERROR, logger="app.api.routes.endpoints"):
            boom = await client.get(f"/threads/{tid}/boom")
            opaque = await client.get(f"/threads/{tid}/opaque")
    assert boom.status_code == 500
    assert boom.json() == {
        "error": {
            "code": "endpoint_error",
            "message": "The endpoint `GET /threads/{id}/boom` raised RuntimeError; the error has been logged.",
        }
    }
    assert "internal detail 42" not in boom.text
    assert "internal detail 42" in caplog.text  # the log has the whole story
    assert opaque.status_code == 500 and opaque.json()["error"]["code"] == "endpoint_error"
    assert "not JSON-serialisable" in opaque.json()["error"]["message"]


async def test_auth_and_another_users_thread(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path)
    async with app.state.runtime.sessions() as s, s.begin():
        _, alice = await keys.create(s, "alice", False)
        _, bob = await keys.create(s, "bob", False)
    async with client_for(app, alice) as a, client_for(app, bob) as b, client_for(app) as anonymous:
        tid = (await a.post("/threads", json={"agent": "assistant"})).json()["id"]
        assert (await a.get(f"/threads/{tid}/summary")).status_code == 200
        for response in (
            await b.get(f"/threads/{tid}/summary"),
            await b.post(f"/threads/{tid}/note", json={"text": "hi"}),
            await b.get(f"/threads/{tid}/nothing"),
        ):
            assert response.status_code == 404 and response.json()["error"]["code"] == "thread_not_found"
        assert (await anonymous.get(f"/threads/{tid}/summary")).status_code == 401
        assert (await a.get(f"/threads/{tid}/messages")).json()["messages"] == []


async def test_a_custom_endpoint_may_take_a_non_json_body(app_factory: Any, tmp_path: Path) -> None:
    app = await start(app_factory, tmp_path)
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        echoed = await client.post(f"/threads/{tid}/echo", content=b"a,b\n1,2", headers={"content-type": "text/csv"})
        assert echoed.json() == {"body": "a,b\n1,2", "type": "text/csv"}
        refused = await client.post(f"/threads/{tid}/stop", content=b"x", headers={"content-type": "text/plain"})
        assert refused.status_code == 415  # built-in routes still take JSON only
