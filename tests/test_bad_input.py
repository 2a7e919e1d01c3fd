"""Hostile input never reaches a 500 nor stalls the server: NUL bytes, huge numbers, deep JSON, oversized bodies."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from PIL import Image
from sqlalchemy import text

from app import catalog
from app.api import schemas
from tests.conftest import ROOT, client_for
from tests.test_api import _catalog, assert_error


@pytest.fixture
async def client(app_factory: Any) -> Any:
    app: FastAPI = await app_factory(_catalog(), max_body_bytes=100_000)
    async with client_for(app) as c:
        yield c


async def _thread(client: httpx.AsyncClient) -> str:
    tid: str = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
    return tid


@pytest.mark.parametrize(
    "body",
    [
        {"agent": "assistant", "name": "a\u0000b"},
        {"agent": "assistant", "tags": ["\u0000"]},
        {"agent": "assistant", "env": {"X": "\u0000"}},
        {"agent": "assistant\u0000"},
        {"agent": "assistant", "messages": [{"content": "hi\u0000"}]},
    ],
)
async def test_nul_bytes_in_thread_bodies_are_refused(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    assert_error(await client.post("/threads", json=body), 422, "invalid_request")
    assert (await client.get("/threads")).json()["threads"] == []


async def test_nul_bytes_in_messages_and_queries_are_refused(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    for body in ({"content": "a\u0000"}, {"content": "a", "metadata": {"k": ["\u0000"]}}):
        assert_error(await client.post(f"/threads/{tid}/messages", json=body), 422, "invalid_request")
    assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []
    missing = f"/threads/{uuid.uuid4()}/messages"  # a thread that is not there is not found, whatever the body
    assert_error(await client.post(missing, json={"content": "a\u0000"}), 404, "thread_not_found")
    for params in ({"agent": "\u0000"}, {"tag": "\u0000"}, {"cursor": "\u0000"}):
        response = await client.get("/threads", params=params)
        assert 400 <= response.status_code < 500, response.text


async def test_huge_numbers_are_refused(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    for path in (f"/threads/{tid}/events?since=99999999999999999999999", "/threads?limit=99999999999999999999"):
        assert_error(await client.get(path), 422, "invalid_request")
    cursor = await client.get(f"/threads/{tid}/messages", params={"cursor": "99999999999999999999999"})
    assert_error(cursor, 400, "bad_cursor")


def _deep_json(depth: int) -> bytes:
    return b'{"content": "x", "metadata": {"k": ' + b"[" * depth + b"]" * depth + b"}}"


async def test_deep_json_is_refused(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    response = await client.post(
        f"/threads/{tid}/messages", content=_deep_json(5000), headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500, response.text


async def test_oversized_bodies_are_413(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    response = await client.post(f"/threads/{tid}/messages", json={"content": "x" * 200_000})
    assert_error(response, 413, "too_large")
    assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []


LONE = '"\\ud800"'  # JSON text of an unpaired surrogate: valid JSON, not valid Unicode


@pytest.mark.parametrize(
    "template",
    [
        '{"agent": "assistant", "tags": [%s]}',
        '{"agent": "assistant", "name": %s}',
        '{"agent": "assistant", "env": {%s: "x"}}',
        '{"agent": "assistant", "env": {"X": %s}}',
        '{"agent": "assistant", "messages": [{"content": "a", "metadata": {"k": %s}}]}',
    ],
)
async def test_unpaired_surrogates_are_400_not_500(client: httpx.AsyncClient, template: str) -> None:
    body = (template % LONE).encode()
    response = await client.post("/threads", content=body, headers={"content-type": "application/json"})
    assert_error(response, 400, "invalid_text")
    assert (await client.get("/threads")).json()["threads"] == []


async def test_unpaired_surrogates_in_messages_and_env_are_400(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    json = {"content-type": "application/json"}
    for body in (
        b'{"content": "a", "metadata": {"k": "\\udc00"}}',
        b'{"content": "\\ud800x"}',
        b'{"content": "\xed\xa0\x80"}',  # the raw bytes of a surrogate, which Python's decoder lets through
    ):
        response = await client.post(f"/threads/{tid}/messages", content=body, headers=json)
        assert_error(response, 400, "invalid_text")
    form = {"content": (None, "a"), "metadata": (None, '{"k": "\\ud800"}')}  # multipart, no file
    assert_error(await client.post(f"/threads/{tid}/messages", files=form), 400, "invalid_text")
    response = await client.put("/env/user/NAME", content=b'{"value": "\\ud800"}', headers=json)
    assert_error(response, 400, "invalid_text")
    assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []
    pair = b'{"content": "\\ud83d\\ude00"}'  # a surrogate pair is an emoji, and fine
    assert (await client.post(f"/threads/{tid}/messages", content=pair, headers=json)).status_code == 202
    stored = await client.get(f"/threads/{tid}/messages")
    assert stored.json()["messages"][0]["content"] == "\U0001f600"


async def test_json_that_is_not_utf8_and_multipart_in_other_charsets_are_400(client: httpx.AsyncClient) -> None:
    """Python's decoder takes UTF-16 and UTF-32 too, and a multipart charset can decode to a lone surrogate."""
    tid = await _thread(client)
    for encoding in ("utf-16", "utf-32", "utf-16-be"):
        body = '{"value": "\\ud800"}'.encode(encoding)
        response = await client.put("/env/user/X", content=body, headers={"content-type": "application/json"})
        assert_error(response, 400, "invalid_text")
        body = '{"name": "\\ud800"}'.encode(encoding)
        response = await client.patch(f"/threads/{tid}", content=body, headers={"content-type": "application/json"})
        assert_error(response, 400, "invalid_text")
    form = b'--b\r\nContent-Disposition: form-data; name="content"\r\n\r\n+2AA-\r\n--b--\r\n'  # UTF-7 for \ud800
    for charset in ("utf-7", "unicode-escape", "nonsense"):
        headers = {"content-type": f"multipart/form-data; boundary=b; charset={charset}"}
        response = await client.post(f"/threads/{tid}/messages", content=form, headers=headers)
        assert_error(response, 400, "malformed_multipart")
    headers = {"content-type": "multipart/form-data; boundary=b; charset=UTF-8"}
    assert (await client.post(f"/threads/{tid}/messages", content=form, headers=headers)).status_code == 202


async def test_deep_json_with_escaped_pairs_is_refused_not_500(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    deep = b'{"content": "\\ud83d\\ude00", "metadata": {"k": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    response = await client.post(f"/threads/{tid}/messages", content=deep, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, response.text
    form = {"content": (None, "a"), "metadata": (None, '{"k": ' + "[" * 5000 + "]" * 5000 + "}")}
    assert_error(await client.post(f"/threads/{tid}/messages", files=form), 400, "invalid_request")


async def test_a_cursor_past_the_calendar_is_400(client: httpx.AsyncClient) -> None:
    for stamp in ("9999-12-31T23:59:59-10:00", "2026-01-01T00:00:00"):
        cursor = base64.urlsafe_b64encode(f"{stamp}|{uuid.uuid4()}".encode()).decode()
        assert_error(await client.get("/threads", params={"cursor": cursor}), 400, "bad_cursor")


@pytest.mark.parametrize(
    "body", [{"content": ""}, {"content": "   \n\t"}, {}, {"content": None}, {"content": "", "attachments": []}]
)
async def test_an_empty_message_is_422_and_starts_nothing(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    tid = await _thread(client)
    assert_error(await client.post(f"/threads/{tid}/messages", json=body), 422, "invalid_request")
    assert_error(await client.post(f"/threads/{tid}/messages", files={"content": (None, " ")}), 422, "invalid_request")
    null = await client.post(f"/threads/{tid}/messages", content=b"null", headers={"content-type": "application/json"})
    assert_error(null, 422, "invalid_request")
    thread = await client.post("/threads", json={"agent": "assistant", "messages": [body]})
    assert_error(thread, 422, "invalid_request")
    assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []
    assert (await client.get(f"/threads/{tid}")).json()["status"] == "idle"
    only_a_file = {"file": ("a.txt", b"hello", "text/plain")}
    assert (await client.post(f"/threads/{tid}/messages", files=only_a_file)).status_code == 202


async def _chunks(body: bytes, size: int = 8192) -> Any:
    for i in range(0, len(body), size):
        yield body[i : i + size]


async def test_chunked_bodies_are_counted_as_they_arrive(client: httpx.AsyncClient) -> None:
    """A body without `Content-Length` is cut off at the limit, whatever route reads it."""
    json = {"content-type": "application/json"}
    big = b'{"agent": "assistant", "messages": [{"content": "' + b"x" * 200_000 + b'"}]}'
    assert_error(await client.post("/threads", content=_chunks(big), headers=json), 413, "too_large")
    assert (await client.get("/threads")).json()["threads"] == []
    tid = await _thread(client)
    message = b'{"content": "' + b"x" * 200_000 + b'"}'
    response = await client.post(f"/threads/{tid}/messages", content=_chunks(message), headers=json)
    assert_error(response, 413, "too_large")
    assert (await client.get(f"/threads/{tid}/messages")).json()["messages"] == []
    small = b'{"content": "hello"}'
    assert (await client.post(f"/threads/{tid}/messages", content=_chunks(small), headers=json)).status_code == 202


async def test_unknown_ids_in_paths(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    assert_error(await client.get(f"/threads/{tid}/messages/{uuid.uuid4()}"), 404, "message_not_found")
    assert_error(await client.get(f"/threads/{tid}/messages/x"), 422, "invalid_request")
    since = await client.get(f"/threads/{tid}/messages", params={"since_id": str(uuid.uuid4())})
    assert_error(since, 404, "message_not_found")


MARK = "__number__"  # where a test body's number goes, once dumped
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e400", "-1.5e309", "9" * 400)  # Python's decoder takes them all


def _schema(node: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = components[node["$ref"].rsplit("/", 1)[1]]
    return node


def _minimal(node: dict[str, Any], components: dict[str, Any]) -> Any:
    """The smallest value the schema takes: required fields only (a message's text), first choices."""
    node = _schema(node, components)
    if "properties" in node:
        either = [b for part in node.get("allOf", []) for b in part.get("anyOf", [])]  # text or a file: the first
        required = node.get("required", []) + [n for b in either[:1] for n in b.get("required", [])]
        return {name: _minimal(node["properties"][name], components) for name in required}
    if "anyOf" in node:
        return _minimal(node["anyOf"][0], components)
    if "enum" in node:
        return node["enum"][0]
    return {"string": "x", "array": [], "object": {}, "boolean": False}.get(node.get("type", ""), 0)


def _targets(node: dict[str, Any], components: dict[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
    """Each place in values of the schema where a number can go (free-form objects, any-typed values, number fields),
    with the smallest value holding `MARK` there."""
    node = _schema(node, components)
    kind = node.get("type")
    if "properties" not in node and "anyOf" in node:  # a union: each branch
        return [t for branch in node["anyOf"] for t in _targets(branch, components)]
    if kind in ("number", "integer") or (kind is None and "properties" not in node):
        return [((), MARK)]
    found: list[tuple[tuple[str, ...], Any]] = []
    if kind == "array" and "items" in node:
        found += [(("0", *at), [value]) for at, value in _targets(node["items"], components)]
    if kind == "object":
        base = _minimal(node, components)
        if node.get("additionalProperties", True) is not False:  # names of its own: a number under one
            found.append((("n",), {**base, "n": MARK}))
        for name, prop in node.get("properties", {}).items():
            found += [((name, *at), {**base, name: value}) for at, value in _targets(prop, components)]
    return found


def _url(path: str, op: dict[str, Any], thread_id: str) -> str:
    for param in op.get("parameters", []):
        if param["in"] == "path":
            schema = param["schema"]
            value = thread_id if param["name"] == "thread_id" else schema.get("enum", [str(uuid.uuid4())])[0]
            path = path.replace("{" + param["name"] + "}", value)
    return path


async def _stored(app: FastAPI) -> dict[str, str]:
    """A digest of every table's rows: what a refused request must leave as it was."""
    async with app.state.runtime.sessions() as session:
        query = text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        names = (await session.execute(query)).scalars().all()
        digest = "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM \"{}\" t"
        return {name: (await session.execute(text(digest.format(name)))).scalar_one() for name in names}


async def test_non_finite_numbers_in_every_json_field_are_422_naming_it_and_store_nothing(app_factory: Any) -> None:
    """Every operation of the document that takes JSON (a body, or a multipart part carried as JSON), a number JSON
    cannot carry in each free-form or number field: 422 `invalid_request` naming the field, nothing written."""
    app: FastAPI = await app_factory(_catalog())
    async with client_for(app) as client:
        document = (await client.get("/openapi.json")).json()
        components = document["components"]["schemas"]
        tid = await _thread(client)
        await client.post(f"/threads/{tid}/messages", json={"content": "x", "metadata": {"n": 1.5, "m": [10**300]}})
        tried: set[str] = set()
        for route, item in document["paths"].items():
            for method, op in item.items():
                url = _url(route, op, tid)
                for media, spec in op.get("requestBody", {}).get("content", {}).items():
                    schema = spec["schema"]
                    if media == "application/json":
                        cases = [(at, json.dumps(body), None) for at, body in _targets(schema, components)]
                    else:  # multipart: its parts carried as JSON
                        form = {k: (None, str(v)) for k, v in _minimal(schema, components).items()}
                        parts = [
                            k for k, e in spec.get("encoding", {}).items() if e["contentType"] == "application/json"
                        ]
                        cases = [
                            ((part, *at), json.dumps(value), part)
                            for part in parts
                            for at, value in _targets(schema["properties"][part], components)
                        ]
                    for at, body, part in cases:
                        field = ".".join(at)
                        tried.add(f"{method.upper()} {route} {media} {field}")
                        for number in NON_FINITE:
                            sent = body.replace(f'"{MARK}"', number)
                            before = await _stored(app)
                            if part is None:
                                headers = {"content-type": "application/json"}
                                response = await client.request(method, url, content=sent, headers=headers)
                            else:
                                files = {**form, part: (None, sent, "application/json")}
                                response = await client.request(method, url, files=files)
                            error = assert_error(response, 422, "invalid_request")
                            assert error["details"]["problems"][0]["field"] == field, (method, route, sent)
                            assert field in error["message"] and len(error["message"]) < 200
                            assert await _stored(app) == before, (method, route, sent)
        messages = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    [queued] = messages  # large finite numbers are fine
    assert queued["metadata"]["n"] == 1.5 and queued["metadata"]["m"] == [10**300]
    assert {  # the walk reached every place JSON with numbers enters today
        "POST /threads application/json env.n",
        "POST /threads application/json messages.0.metadata.n",
        "PATCH /threads/{thread_id} application/json env.n",
        "POST /threads/{thread_id}/messages application/json metadata.n",
        "POST /threads/{thread_id}/messages multipart/form-data metadata.n",
        "POST /threads/{thread_id}/variables/{request_id} application/json env.n",
    } <= tried, tried


async def test_a_custom_endpoint_gets_json_without_non_finite_numbers(client: httpx.AsyncClient) -> None:
    """The runtime hands an endpoint its JSON body checked alike (its handler reads it itself)."""
    tid = await _thread(client)
    json_type = {"content-type": "application/json"}
    response = await client.post(f"/threads/{tid}/anything", content=b'{"a": [1, Infinity]}', headers=json_type)
    error = assert_error(response, 422, "invalid_request")
    assert error["details"]["problems"][0]["field"] == "a.1"
    plain = await client.post(f"/threads/{tid}/anything", content=b'{"a": [1, 2]}', headers=json_type)
    assert_error(plain, 404, "endpoint_not_found")  # a finite body reaches the dispatch


def _problem_fields(response: httpx.Response, status: int = 422, code: str = "invalid_request") -> set[str]:
    return {p["field"] for p in assert_error(response, status, code)["details"]["problems"]}


async def test_tags_and_names_are_bounded_and_a_refused_patch_stores_nothing(app_factory: Any) -> None:
    """The probe's 9 MB of tags (100 tags of 90,000 characters, under the body limit) is refused by name."""
    app: FastAPI = await app_factory(_catalog())
    async with client_for(app) as client:
        tid = await _thread(client)
        before = await _stored(app)
        huge = await client.patch(f"/threads/{tid}", json={"tags": ["t" * 90_000] * 100})
        assert "tags" in _problem_fields(huge)
        assert _problem_fields(await client.patch(f"/threads/{tid}", json={"tags": ["t"] * 51})) == {"tags"}
        assert _problem_fields(await client.patch(f"/threads/{tid}", json={"tags": ["t" * 129]})) == {"tags.0"}
        assert _problem_fields(await client.patch(f"/threads/{tid}", json={"name": "n" * 501})) == {"name"}
        created = await client.post("/threads", json={"agent": "assistant", "tags": ["t" * 129]})
        assert _problem_fields(created) == {"tags.0"}
        assert await _stored(app) == before
        most = await client.patch(f"/threads/{tid}", json={"tags": [f"{i:03}" + "t" * 125 for i in range(50)]})
        assert most.status_code == 200 and len(most.json()["tags"]) == 50


async def test_metadata_and_attachments_are_bounded_and_refusals_store_nothing(app_factory: Any) -> None:
    app: FastAPI = await app_factory(_catalog())
    async with client_for(app) as client:
        tid = await _thread(client)
        before = await _stored(app)
        big = {"k": "m" * schemas.METADATA_BYTES}
        url = f"/threads/{tid}/messages"
        assert _problem_fields(await client.post(url, json={"content": "x", "metadata": big})) == {"metadata"}
        form: dict[str, Any] = {"content": (None, "x"), "metadata": (None, json.dumps(big), "application/json")}
        assert _problem_fields(await client.post(url, files=form)) == {"metadata"}
        nested = await client.post(
            "/threads", json={"agent": "assistant", "messages": [{"content": "x", "metadata": big}]}
        )
        assert _problem_fields(nested) == {"messages.0.metadata"}
        one = {"name": "a.txt", "mime_type": "text/plain", "data": base64.b64encode(b"a").decode()}
        many = await client.post(url, json={"content": "x", "attachments": [one] * 21})
        assert _problem_fields(many) == {"attachments"}
        assert await _stored(app) == before
        fits = {"k": "m" * (schemas.METADATA_BYTES - len('{"k":""}'))}
        assert (await client.post(url, json={"content": "x", "metadata": fits})).status_code == 202


async def test_parameters_are_bounded(client: httpx.AsyncClient) -> None:
    tid = await _thread(client)
    assert _problem_fields(await client.get("/threads", params={"tag": "t" * 1001})) == {"query.tag"}
    assert _problem_fields(await client.get("/threads", params={"cursor": "c" * 201})) == {"query.cursor"}
    assert _problem_fields(await client.get(f"/agents/{'a' * 201}")) == {"path.name"}
    stream = await client.get(f"/threads/{tid}/events", headers={"Last-Event-ID": "1" * 101})
    assert _problem_fields(stream) == {"header.last-event-id"}


@pytest.mark.slow  # a load test: ~20 s of decoding and parsing on purpose; its bounds hold on a quiet machine only
async def test_the_worst_inputs_never_keep_health_waiting(app_factory: Any, serve: Any) -> None:
    """Fired together at a real server with its worker (as `agents serve` runs), the inputs that once froze or
    bloated it leave `/health` on the same process answering within a second throughout."""
    app: FastAPI = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    base = await serve(app)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
        long_path = "/".join(("a" * 250, "a" * 148))
        await client.put(f"/threads/{tid}/fs/{long_path}", content=b"a" * 25 + b"!\n")
        image = io.BytesIO()
        Image.new("RGB", (6000, 6600), "teal").save(image, "PNG")
        await client.put(f"/threads/{tid}/fs/big.png", content=image.getvalue(), headers={"content-type": "image/png"})
        for i in range(20):  # twenty other images, each its own decode
            small = io.BytesIO()
            Image.new("RGB", (2000 + i, 2000), "teal").save(small, "PNG")
            await client.put(
                f"/threads/{tid}/fs/{i}.png", content=small.getvalue(), headers={"content-type": "image/png"}
            )
        json = {"content-type": "application/json"}
        hostile = [
            client.get(f"/threads/{tid}/fs", params={"find": "/**b**b**b**b**bZ"}),
            client.get(f"/threads/{tid}/fs", params={"grep": "(a+)+$"}),
            *(client.get(f"/threads/{tid}/fs/big.png", params={"thumbnail": 1}) for _ in range(8)),
            *(client.get(f"/threads/{tid}/fs/{i}.png", params={"thumbnail": 1}) for i in range(20)),
            client.post("/threads", json={"agent": "assistant", "env": {f"V{i}": "x" * 100 for i in range(5000)}}),
            client.post("/threads", content=_chunks(b'{"agent": "' + b"a" * 30_000_000 + b'"}', 65536), headers=json),
            client.post(f"/threads/{tid}/messages", content=_deep_json(5000), headers=json),
            client.post(f"/threads/{tid}/messages", json={"content": "1" * 999_999 + "+"}),
            client.post("/threads", content=b'{"agent": "assistant", "tags": ["\\ud800"]}', headers=json),
        ]
        waits: list[float] = []
        reads: list[float] = []  # a request that needs the database meanwhile: it finds a connection
        attack = asyncio.gather(*hostile)
        while not attack.done():
            started = time.perf_counter()
            assert (await client.get("/health")).status_code == 200
            waits.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert (await client.get(f"/threads/{tid}")).status_code == 200
            reads.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)
        answers = await attack
    failed = [(a.status_code, a.text[:200]) for a in answers if a.status_code >= 500]
    assert all(text.startswith('{"error":{"code":"busy"') for _, text in failed), failed  # thumbnails: retry later
    # probed while the attack ran (on a quiet machine it is over in ~0.2 s: the limits refuse most of it at once)
    assert len(waits) >= 3 and max(waits) < 1.0, sorted(waits)[-5:]
    assert max(reads) < 2.0, sorted(reads)[-5:]
