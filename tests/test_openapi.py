"""The OpenAPI document says what the server does: the error envelope, bearer auth, every failure a route can
answer, `Allow` on a 405, and a bounded schemathesis run (all operations but the streams) finds nothing."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app import catalog, keys
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
            if status[0] in "45":
                assert response["content"] == ERROR, (method, path, status)
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
