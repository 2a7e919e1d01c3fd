"""The OpenAPI document says what the server does: the error envelope, bearer auth, every failure a route can
answer, `Allow` on a 405, and a bounded schemathesis run (all operations but the streams) finds nothing. It is a
contract clients are generated from: stable operation ids, every event type's frame, the catalog's custom endpoints,
examples that are real answers, one version, and a generator that builds a client from it without a warning."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app import __version__, catalog, event_types, keys
from app.api import examples, frames, schemas
from app.api.app import create_app
from app.settings import Settings
from tests.conftest import ROOT, client_for

ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


@pytest.fixture
async def app(app_factory: Any) -> FastAPI:
    started: FastAPI = await app_factory(catalog.load(ROOT / "agents"))
    return started


async def _document(app: FastAPI) -> dict[str, Any]:
    async with client_for(app) as client:
        document: dict[str, Any] = (await client.get("/openapi.json")).json()
    return document


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), p, op) for p, item in document["paths"].items() for m, op in item.items()]


async def test_errors_are_the_envelope_and_auth_is_a_bearer_scheme(app: FastAPI) -> None:
    document = await _document(app)
    assert "HTTPValidationError" not in str(document) and "ValidationError" not in document["components"]["schemas"]
    assert document["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (`agents keys create`); none in open mode.",
    }
    for method, path, op in _operations(document):
        assert all(p["name"].lower() != "authorization" for p in op.get("parameters", [])), (method, path)
        for status, response in op["responses"].items():
            if status[0] in "45":  # the envelope, and maybe an example of it
                assert {k: {"schema": v["schema"]} for k, v in response["content"].items()} == ERROR, (method, path)
        if path not in ("/health", "/ready"):
            assert op["security"] == [{"HTTPBearer": []}], (method, path)
            assert {"401", "403", "503"} <= set(op["responses"]), (method, path)
        if "requestBody" in op:
            assert {"400", "413", "415", "422"} <= set(op["responses"]), (method, path)
        if "{" in path:
            assert "404" in op["responses"], (method, path)


def _unbounded(node: dict[str, Any], where: str, components: dict[str, Any]) -> list[str]:
    """The places under a request schema with no documented bound: a string without `maxLength` (or `x-max-bytes`,
    an enum, a UUID), an array without `maxItems`, an object open to more names without `maxProperties` and bounded
    names, free-form JSON (any value) without `x-max-bytes`."""
    if "$ref" in node:
        return _unbounded(components[node["$ref"].rsplit("/", 1)[1]], where, components)
    outer = {k: v for k, v in node.items() if k in ("maxLength", "maxItems", "maxProperties", "x-max-bytes")}
    branches = [{**outer, **b} for b in node.get("anyOf", []) + node.get("oneOf", [])]  # the bounds beside apply
    for branch in branches:  # a branch constraining properties the object bounds: those bounds hold in it too
        if "properties" in branch:
            branch["properties"] = {
                k: v for k, v in branch["properties"].items() if k not in node.get("properties", {})
            }
    found = [p for branch in branches for p in _unbounded(branch, where, components)]
    kind = node.get("type")
    if "x-max-bytes" in node or "enum" in node or "const" in node:
        return found  # bounded whole (free-form JSON by its encoding's size)
    if kind == "string" and "maxLength" not in node and node.get("format") != "uuid":
        found.append(where)
    elif kind == "array":
        found += [] if "maxItems" in node else [where]
        found += _unbounded(node["items"], f"{where}[]", components) if "items" in node else []
    elif kind == "object" or "properties" in node:
        for name, prop in node.get("properties", {}).items():
            found += _unbounded(prop, f"{where}.{name}", components)
        extra = node.get("additionalProperties", kind == "object")  # JSON Schema's default: any further names
        if extra is not False and kind == "object":
            names = node.get("propertyNames", {})
            found += [] if "maxProperties" in node and "maxLength" in names else [f"{where} (its names)"]
            found += _unbounded(extra if isinstance(extra, dict) else {}, f"{where}.*", components)
    elif kind is None and not node.get("anyOf") and not node.get("oneOf"):
        found.append(where)  # any JSON value
    return found


def _request_fields(document: dict[str, Any]) -> list[str]:
    components = document["components"]["schemas"]
    found = []
    for method, path, op in _operations(document):
        for param in op.get("parameters", []):
            found += _unbounded(param["schema"], f"{method} {path} {param['in']} {param['name']}", components)
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            found += _unbounded(content["schema"], f"{method} {path} body ({media})", components)
    return found


async def test_every_request_field_is_bounded(app: FastAPI) -> None:
    """Each string, array and object a request carries (body, query, path, header) has a documented limit, so a
    route added later without one fails here (`http-api.md`, Limits)."""
    assert _request_fields(await _document(app)) == []
    walked = {  # the walk finds what it should
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "a": {"type": "array", "items": {"type": "string", "maxLength": 1}},
            "free": {"type": "object"},
            "map": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 1}},
            "any": {},
            "ok": {"anyOf": [{"type": "string", "format": "uuid"}, {"type": "null"}]},
            "json": {"type": "object", "x-max-bytes": 10},
        },
        "additionalProperties": False,
    }
    assert _unbounded(walked, "b", {}) == ["b.s", "b.a", "b.free (its names)", "b.free.*", "b.map (its names)", "b.any"]


async def test_bounds_a_setting_decides_are_its_value(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"), env_max_variables=7, max_file_bytes=5000)
    document = await _document(app)
    env = document["components"]["schemas"]["ThreadPatch"]["properties"]["env"]
    assert env["maxProperties"] == 7 and env["additionalProperties"]["x-max-bytes"] == 64 * 1024
    files = document["paths"]["/threads/{thread_id}/messages"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert files["schema"]["properties"]["files"]["items"]["x-max-bytes"] == 5000
    assert "x-bounds-by-setting" not in str(document)


async def test_a_thread_names_a_hosted_agent_and_links_to_its_operations(app: FastAPI) -> None:
    document = await _document(app)
    agent = document["components"]["schemas"]["ThreadIn"]["properties"]["agent"]
    assert agent["enum"] == sorted(catalog.load(ROOT / "agents").agents)
    links = document["paths"]["/threads"]["post"]["responses"]["201"]["links"]
    on_a_thread = [op for _, path, op in _operations(document) if path.startswith("/threads/{thread_id}")]
    assert {link["operationId"] for link in links.values()} == {op["operationId"] for op in on_a_thread}
    assert all(link["parameters"] == {"path.thread_id": "$response.body#/id"} for link in links.values())


async def test_a_405_allows_every_method_of_the_path(app: FastAPI) -> None:
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        for path, allow in (
            ("/threads", "GET, POST"),
            (f"/threads/{tid}/messages", "GET, POST"),
            (f"/threads/{tid}/fs/a.txt", "DELETE, GET, PUT"),
            ("/env/user/NAME", "DELETE, GET, PUT"),
        ):
            response = await client.request("OPTIONS", path)
            assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"
            assert sorted(response.headers["allow"].split(", ")) == allow.split(", "), path


@pytest.mark.slow  # schemathesis fuzzes every operation over real HTTP (a process of its own), ~30 s
async def test_schemathesis_finds_no_server_error_and_no_conformance_failure(
    app: FastAPI, serve: Any, tmp_path: Path
) -> None:
    """Bounded (a fixed seed, a few examples per operation), every check; the streams are left out (they never
    end). NUL is not generated: Postgres cannot store it, and the schema cannot say so for free-form JSON."""
    async with app.state.runtime.sessions() as session:
        _, key = await keys.create(session, "schemathesis")
        await session.commit()
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base) as client:  # open mode ends once the server hears of the key
        for _ in range(100):
            if (await client.get("/threads")).status_code == 401:
                break
            await asyncio.sleep(0.05)
    st = Path(sys.executable).parent / "st"
    process = await asyncio.create_subprocess_exec(
        *(str(st), "--config-file", str(ROOT / "tests" / "schemathesis.toml"), "run", f"{base}/openapi.json"),
        *("--checks", "all", "--seed", "1", "--max-examples", "5", "--workers", "1"),
        *("--exclude-path-regex", "/events", "--header", f"Authorization: Bearer {key}"),
        *("--generation-allow-x00", "false", "--generation-database", "none", "--no-color"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,  # its cache goes there, not into the checkout
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=600)
    assert process.returncode == 0, output.decode()[-8000:]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_every_asset_from_the_server(app: FastAPI, page: str) -> None:
    """Offline: the page and everything it references come from this server (no CDN, no fonts, no validator)."""
    async with client_for(app) as client:
        html = (await client.get(page)).text
        assert "http://" not in html and "https://" not in html, html
        assets = re.findall(r"""(?:src|href)="([^"]+)"|url: '([^']+)'|spec-url="([^"]+)\"""", html)
        urls = {next(u for u in found if u) for found in assets}
        assert any(u.endswith(".js") for u in urls) and "/openapi.json" in urls, urls
        for url in urls:
            response = await client.get(url)
            assert response.status_code == 200 and response.content, url


# -- the contract -------------------------------------------------------------------------------------------------

ENDPOINTS = {  # a catalog's custom endpoints, with the routes that make ids hard: the root, parameters, a clash
    "summary.get.py": "GET /threads/{thread_id}/summary",
    "index.post.py": "POST /threads/{thread_id}",
    "items/[item].put.py": "PUT /threads/{thread_id}/items/{item}",
    "files/[...rest].delete.py": "DELETE /threads/{thread_id}/files/{rest}",
    "a-b.py": "GET /threads/{thread_id}/a-b",
    "a_b.py": "GET /threads/{thread_id}/a_b",
}
ENDPOINT_IDS = {
    "GET /threads/{thread_id}/summary": "endpointGetSummary",
    "POST /threads/{thread_id}": "endpointPost",
    "PUT /threads/{thread_id}/items/{item}": "endpointPutItemsByItem",
    "DELETE /threads/{thread_id}/files/{rest}": "endpointDeleteFilesByRest",
    "GET /threads/{thread_id}/a-b": "endpointGetAB",
    "GET /threads/{thread_id}/a_b": "endpointGetAB2",
}
# the built-in operations' ids: clients are generated from them, so a change is a breaking change made on purpose
IDS = {
    "GET /health": "getHealth",
    "GET /ready": "getReady",
    "GET /metrics": "getMetrics",
    "GET /agents": "listAgents",
    "GET /agents/{name}": "getAgent",
    "POST /threads": "createThread",
    "GET /threads": "listThreads",
    "GET /threads/{thread_id}": "getThread",
    "PATCH /threads/{thread_id}": "updateThread",
    "DELETE /threads/{thread_id}": "deleteThread",
    "POST /threads/{thread_id}/stop": "stopThread",
    "POST /threads/{thread_id}/continue": "continueThread",
    "POST /threads/{thread_id}/terminate": "terminateThread",
    "POST /threads/{thread_id}/messages": "postMessage",
    "GET /threads/{thread_id}/messages": "listMessages",
    "GET /threads/{thread_id}/messages/{message_id}": "getMessage",
    "PATCH /threads/{thread_id}/messages/{message_id}": "editMessage",
    "DELETE /threads/{thread_id}/messages/{message_id}": "deleteMessage",
    "GET /threads/{thread_id}/logs": "listLogs",
    "GET /threads/{thread_id}/logs/{log_id}": "getLog",
    "GET /threads/{thread_id}/events": "streamEvents",
    "GET /events": "streamAllEvents",
    "POST /stream-tokens": "createStreamToken",
    "GET /threads/{thread_id}/fs": "listFiles",
    "GET /threads/{thread_id}/fs/{path}": "downloadFile",
    "PUT /threads/{thread_id}/fs/{path}": "uploadFile",
    "DELETE /threads/{thread_id}/fs/{path}": "deleteFile",
    "GET /threads/{thread_id}/effects": "listEffects",
    "POST /threads/{thread_id}/effects/{effect_id}/cancel": "cancelEffect",
    "GET /threads/{thread_id}/subagents": "listSubagents",
    "GET /threads/{thread_id}/variables/{request_id}": "getVariableRequest",
    "POST /threads/{thread_id}/variables/{request_id}": "provideVariables",
    "GET /env/{scope}": "listEnvVariables",
    "GET /env/{scope}/{name}": "getEnvVariable",
    "PUT /env/{scope}/{name}": "putEnvVariable",
    "DELETE /env/{scope}/{name}": "deleteEnvVariable",
}


def _catalog_with_endpoints(tmp_path: Path) -> catalog.Catalog:
    root = tmp_path / "agents"
    shutil.copytree(ROOT / "agents", root, ignore=shutil.ignore_patterns("__pycache__"))
    for file in ENDPOINTS:
        if file == "summary.get.py":
            continue  # the example folder's own
        path = root / "endpoints" / file
        path.parent.mkdir(parents=True, exist_ok=True)
        description = "" if file.startswith("a") else f", description='{file}'"
        path.write_text(
            textwrap.dedent(f"""
                from app.spec import define_thread_endpoint

                @define_thread_endpoint({description.lstrip(", ")})
                async def handler(request, state, params):
                    return params
            """)
        )
    return catalog.load(root)


def _contract(tmp_path: Path) -> tuple[catalog.Catalog, dict[str, Any]]:
    """A catalog with custom endpoints, and the document of an app on it (built without a database)."""
    hosted = _catalog_with_endpoints(tmp_path)
    settings = Settings(database_url="postgresql://docs@127.0.0.1:1/unused")  # never connected: no lifespan runs
    return hosted, create_app(settings, hosted).openapi()


def test_every_operation_has_its_own_stable_camel_case_id_and_a_tag(tmp_path: Path) -> None:
    _, document = _contract(tmp_path)
    ids = {f"{method} {path}": op.get("operationId") for method, path, op in _operations(document)}
    assert all(isinstance(i, str) and re.fullmatch(r"[a-z][A-Za-z0-9]*", i) for i in ids.values()), ids
    assert len(set(ids.values())) == len(ids), "two operations share an id"
    assert ids == {**IDS, **ENDPOINT_IDS}
    assert all(len(op.get("tags", [])) == 1 for _, _, op in _operations(document))
    tags = {path: op["tags"][0] for method, path, op in _operations(document) if f"{method} {path}" in IDS}
    assert tags["/threads/{thread_id}/variables/{request_id}"] == "variables" and tags["/events"] == "events"


def test_every_custom_endpoint_of_the_catalog_is_an_operation(tmp_path: Path) -> None:
    hosted, document = _contract(tmp_path)
    assert len(hosted.endpoints.entries) == len(ENDPOINTS)
    for route, endpoint in hosted.endpoints.entries:
        method, path = ENDPOINTS[route.file].split(" ")
        op = document["paths"][path][method.lower()]
        assert op["tags"] == ["endpoints"] and op["security"] == [{"HTTPBearer": []}]
        assert f"`endpoints/{route.file}`" in op["description"] and "whatever its agent" in op["description"]
        assert op["summary"] == (endpoint.description or f"Custom endpoint `{route.file}`")
        names = [p["name"] for p in op["parameters"] if p["in"] == "path"]
        assert names == re.findall(r"\{(\w+)\}", path)
        assert ("requestBody" in op) == (method in ("POST", "PUT", "PATCH")), route
        assert "415" not in op["responses"] and {"200", "401", "404", "500", "503"} <= set(op["responses"])
    body = document["paths"]["/threads/{thread_id}/items/{item}"]["put"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {"x-max-bytes": Settings().max_body_bytes}


def test_every_event_type_has_a_component_and_each_stream_a_union_of_them(tmp_path: Path) -> None:
    _, document = _contract(tmp_path)
    components = document["components"]["schemas"]
    for stream, table, path in (
        ("ThreadEvent", event_types.THREAD_EVENTS, "/threads/{thread_id}/events"),
        ("LifecycleEvent", event_types.LIFECYCLE_EVENTS, "/events"),
    ):
        union = components[stream]
        assert set(union["discriminator"]["mapping"]) == set(table), stream
        assert [o["$ref"].rsplit("/", 1)[1] for o in union["oneOf"]] == [frames.name(e) for e in table]
        for event, payload in table.items():
            frame = components[frames.name(event)]
            assert frame["properties"]["event"]["const"] == event
            assert ("id" in frame["required"]) == (event not in frames.UNSTORED), event
            data = components[frame["properties"]["data"]["$ref"].rsplit("/", 1)[1]]
            assert set(data["properties"]) == set(payload.__annotations__), event
        ok = document["paths"][path]["get"]["responses"]["200"]
        assert ok["content"] == {"text/event-stream": {"schema": {"$ref": f"#/components/schemas/{stream}"}}}
        for words in ("id: 42", "event: ", "data: ", "`Last-Event-ID`", "`?since=`", "`events_missed`", "`?token="):
            assert words in ok["description"], words
    assert components["FallbackTriggeredPayload"]["required"] == ["from", "to", "error"]  # a keyword as a name
    assert components["ToolStartedPayload"]["required"] == ["tool", "tool_call_id"]  # `depth` is NotRequired
    assert components["ErrorEvent"]["properties"]["data"] == {"$ref": "#/components/schemas/ErrorPayload"}


def test_the_version_is_one_number(tmp_path: Path) -> None:
    """`app.__version__` is the package's (pyproject), the document's `info.version` and `/health`'s (test_api, and
    `http-api.md`'s example)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert __version__ == pyproject["project"]["version"]
    assert f'`{{"status": "ok", "version": "{__version__}"}}`' in (ROOT / "docs" / "http-api.md").read_text()
    _, document = _contract(tmp_path)
    assert document["info"]["version"] == __version__
    health = document["components"]["schemas"]["Health"]
    assert health["required"] == ["status", "version"]
    assert document["paths"]["/health"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Health"
    }


async def test_the_examples_are_on_the_main_operations_and_the_errors_are_real_answers(app: FastAPI) -> None:
    document = await _document(app)
    ops = {op["operationId"]: op for _, _, op in _operations(document)}
    create, post = ops["createThread"], ops["postMessage"]
    assert create["requestBody"]["content"]["application/json"]["example"]["agent"] == "assistant"
    assert "example" in create["responses"]["201"]["content"]["application/json"]
    assert "example" in post["requestBody"]["content"]["application/json"]
    assert {"200", "202"} <= {s for s, r in post["responses"].items() if "example" in r["content"]["application/json"]}
    assert [p["example"] for p in post["parameters"] if p["name"] == "wait"] == [30]
    assert "example" in ops["listMessages"]["responses"]["200"]["content"]["application/json"]
    async with client_for(app) as client:
        answers = {
            ("createThread", "422"): await client.post("/threads", json={}),
            ("getThread", "404"): await client.get(f"/threads/{examples.MISSING_ID}"),
        }
        created = await client.post("/threads", json=create["requestBody"]["content"]["application/json"]["example"])
        assert created.status_code == 201, created.text
    for (operation_id, status), answer in answers.items():
        assert answer.status_code == int(status)
        assert answer.json() == ops[operation_id]["responses"][status]["content"]["application/json"]["example"]


def test_an_example_that_does_not_fit_its_model_fails_the_build() -> None:
    wrong: examples.Table = {"getThread": [("404", schemas.Error, {"error": {"code": "x"}})]}
    with pytest.raises(ValueError, match="message"):
        examples.add({"/t": {"get": {"operationId": "getThread", "responses": {}}}}, wrong)
    extra: examples.Table = {"getThread": [("404", schemas.Error, {"error": {"code": "x", "message": "m"}, "more": 1})]}
    with pytest.raises(ValueError, match="more"):
        examples.add({"/t": {"get": {"operationId": "getThread", "responses": {}}}}, extra)


@pytest.mark.slow  # runs the generator as a process of its own (~2 s)
async def test_a_generator_builds_a_client_from_the_document_without_a_warning(tmp_path: Path) -> None:
    """openapi-python-client, as a client's author would run it: every operation and every event type's frame is
    generated, and it prints nothing but that it generates (no warning about an id, a schema or a union)."""
    _, document = _contract(tmp_path)
    source = tmp_path / "openapi.json"
    source.write_text(json.dumps(document))
    config = tmp_path / "generator.yaml"
    config.write_text("post_hooks: []\n")  # no formatting of the generated code (it would look for ruff)
    out = tmp_path / "client"
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "openapi-python-client"),
        *("generate", "--path", str(source), "--output-path", str(out), "--meta", "none", "--config", str(config)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, output.decode()
    assert output.decode().strip() == f"Generating {out}", output.decode()
    functions = [p for p in (out / "api").rglob("*.py") if p.name != "__init__.py"]
    assert len(functions) == len(IDS) + len(ENDPOINT_IDS)
    models = set(re.findall(r"^from \.\w+ import (\w+)$", (out / "models" / "__init__.py").read_text(), re.MULTILINE))
    events = {*event_types.THREAD_EVENTS, *event_types.LIFECYCLE_EVENTS}
    assert {frames.name(e) for e in events} <= models
    assert {"ThreadIn", "MessageIn", "Thread", "Error", "Health"} <= models
