"""Open mode and other web origins: a page of another origin acts on nothing; no Origin, the server's own origin and
the ones in `CORS_ORIGINS` act as before; with keys the key decides, not the origin."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from playwright.async_api import Page, Response, async_playwright

from app import catalog, keys
from app.api import origins
from tests import processes
from tests.conftest import ROOT, client_for
from tests.test_playground import chromium

EVIL = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
FORM = {"content": (None, "2+2")}  # multipart, as a page's `FormData` or `<form enctype=multipart/form-data>` sends


@pytest.fixture
async def app(app_factory: Any) -> FastAPI:
    result: FastAPI = await app_factory(catalog.load(ROOT / "agents"), cors_origins=["http://127.0.0.1:5173"])
    return result


async def _thread(c: httpx.AsyncClient) -> tuple[str, str]:
    """A thread with one queued message (no worker runs it): its id and the message's."""
    created = await c.post("/threads", json={"agent": "assistant", "messages": [{"content": "hi"}]})
    assert created.status_code == 201, created.text
    tid = created.json()["id"]
    listed = (await c.get(f"/threads/{tid}/messages")).json()
    return tid, listed["messages"][0]["id"]


async def _state(c: httpx.AsyncClient, tid: str) -> tuple[Any, ...]:
    thread = (await c.get(f"/threads/{tid}")).json()
    listed = (await c.get(f"/threads/{tid}/messages")).json()
    files = (await c.get(f"/threads/{tid}/fs")).status_code
    return thread["status"], thread["name"], thread["terminated_at"], listed["messages"], files


def _writes(tid: str, mid: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every kind of write a page could try, each as a CORS-simple request would carry it where it can."""
    return [
        ("POST", f"/threads/{tid}/messages", {"files": FORM}),
        ("POST", f"/threads/{tid}/messages", {"json": {"content": "2+2"}}),
        ("POST", f"/threads/{tid}/stop", {}),
        ("POST", f"/threads/{tid}/terminate", {}),
        ("POST", f"/threads/{tid}/continue", {}),
        ("PATCH", f"/threads/{tid}", {"json": {"name": "owned"}}),
        ("PATCH", f"/threads/{tid}/messages/{mid}", {"json": {"content": "owned"}}),
        ("DELETE", f"/threads/{tid}/messages/{mid}", {}),
        ("PUT", f"/threads/{tid}/fs/x.txt", {"content": b"owned"}),
        ("DELETE", f"/threads/{tid}", {}),
        ("POST", "/threads", {"json": {"agent": "assistant"}}),
        ("PUT", "/env/user/REGION", {"json": {"value": "owned"}}),
        ("POST", "/stream-tokens", {"json": {"thread_id": tid}}),
    ]


def _refused(response: httpx.Response, names: str) -> None:
    assert response.status_code == 403, (response.request.method, response.request.url, response.text)
    error = response.json()["error"]
    assert error["code"] == "cross_origin_refused"
    assert names in error["message"] and "CORS_ORIGINS" in error["message"] and "key" in error["message"]


async def test_another_origin_acts_on_nothing_in_open_mode(app: FastAPI) -> None:
    """The holes reported: a page's form POST or `no-cors` fetch posted messages and stopped threads. Now every write
    (and every read) from another origin is 403, and the thread is as it was."""
    async with client_for(app) as c:
        tid, mid = await _thread(c)
        before = await _state(c, tid)
        threads = len((await c.get("/threads")).json()["threads"])
        pages: list[tuple[dict[str, str], str]] = [
            (EVIL, "`http://evil.example`"),
            ({"Origin": "http://evil.example"}, "`http://evil.example`"),  # a browser without Sec-Fetch-*
            ({"Origin": "null", "Sec-Fetch-Site": "cross-site"}, "`Origin: null`"),  # sandboxed frame, file: page
            ({"Origin": "null"}, "`Origin: null`"),
            ({"Origin": "http://localhost:9000", "Sec-Fetch-Site": "same-site"}, "`http://localhost:9000`"),
            ({"Origin": "https://localhost"}, "`https://localhost`"),  # same name, another scheme
            ({"Sec-Fetch-Site": "cross-site"}, "another site"),  # a GET from a link, an <img>: no Origin
            ({"Sec-Fetch-Site": "same-site"}, "another site"),  # another port of the same name
        ]
        for headers, names in pages:
            for method, path, body in _writes(tid, mid):
                _refused(await c.request(method, path, headers=headers, **body), names)
            for path in (f"/threads/{tid}", "/threads", f"/threads/{tid}/events", "/metrics", "/env/user"):
                _refused(await c.get(path, headers=headers), names)
        assert await _state(c, tid) == before
        assert len((await c.get("/threads")).json()["threads"]) == threads
        assert (await c.get("/env/user")).json()["env"] == {}


async def test_no_origin_the_servers_own_and_listed_origins_act(app: FastAPI) -> None:
    """`curl` and servers send no Origin; the playground's page is of the server's own origin; `CORS_ORIGINS` lists
    the pages the operator allows."""
    async with client_for(app) as c:  # addressed as http://localhost
        for headers in (
            {},
            {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
            {"Origin": "http://localhost"},  # a browser without Sec-Fetch-*
            {"Sec-Fetch-Site": "same-origin"},  # a same-origin GET carries no Origin
            {"Sec-Fetch-Site": "none"},  # typed in the address bar, a bookmark
            {"Origin": "http://127.0.0.1:5173", "Sec-Fetch-Site": "same-site"},  # listed
            {"Origin": "http://127.0.0.1:5173", "Sec-Fetch-Site": "cross-site"},
            # a proxy in front rewrote Host: the browser still says the page is of the URL's own origin
            {"Origin": "http://localhost:5173", "Sec-Fetch-Site": "same-origin"},
        ):
            tid, _ = await _thread(c)
            assert (await c.get(f"/threads/{tid}", headers=headers)).status_code == 200, headers
            posted = await c.post(f"/threads/{tid}/messages", files=FORM, headers=headers)
            assert posted.status_code == 202, (headers, posted.text)
            assert (await c.patch(f"/threads/{tid}", json={"name": "n"}, headers=headers)).status_code == 200
            assert (await c.post(f"/threads/{tid}/terminate", headers=headers)).json()["status"] == "terminated"
            assert (await c.delete(f"/threads/{tid}", headers=headers)).status_code == 200
    async with client_for(app) as c:
        c.base_url = httpx.URL("http://127.0.0.1:8000")
        assert (await c.get("/threads", headers={"Origin": "http://127.0.0.1:8000"})).status_code == 200
        _refused(await c.get("/threads", headers={"Origin": "http://127.0.0.1"}), "`http://127.0.0.1`")


async def test_a_wildcard_in_cors_origins_lets_no_page_act_in_open_mode(app_factory: Any) -> None:
    """`*` lets any page call with a key; without one it would hand every page the user's threads."""
    app = await app_factory(catalog.load(ROOT / "agents"), cors_origins=["*"])
    async with client_for(app) as c:
        _refused(await c.post("/threads", json={"agent": "assistant"}, headers=EVIL), "`http://evil.example`")
        assert (await c.post("/threads", json={"agent": "assistant"})).status_code == 201


async def test_the_playground_loads_from_a_link_on_another_site(app: FastAPI) -> None:
    """Following a link to `/` from another site loads the page (static, no data); the API calls a link could make
    are refused, a custom endpoint's GET too."""
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}
    async with client_for(app) as c:
        tid, _ = await _thread(c)
        for path in ("/", "/playground/app.js", "/playground/style.css", "/health"):
            assert (await c.get(path, headers=link)).status_code == 200, path
        for path in ("/threads", f"/threads/{tid}", f"/threads/{tid}/anything", f"/threads/{tid}/fs"):
            _refused(await c.get(path, headers=link), "another site")
        form = await c.post(
            f"/threads/{tid}/messages", files=FORM, headers={**link, "Origin": "http://evil.example"}
        )  # a <form> POST is a navigation too
        _refused(form, "`http://evil.example`")


async def test_with_keys_the_key_decides_not_the_origin(app: FastAPI) -> None:
    """A browser never adds a bearer key by itself, and sends one cross-origin only after a preflight that CORS
    answers: with keys, a request from any origin that carries a valid key acts, and one without is 401."""
    async with app.state.runtime.sessions() as s, s.begin():
        _, key = await keys.create(s, "ivy")
    async with client_for(app, key) as c:
        created = await c.post("/threads", json={"agent": "assistant"}, headers=EVIL)
        assert created.status_code == 201
        tid = created.json()["id"]
        assert (await c.post(f"/threads/{tid}/messages", files=FORM, headers=EVIL)).status_code == 202
    async with client_for(app) as anonymous:
        response = await anonymous.post(f"/threads/{tid}/messages", files=FORM, headers=EVIL)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"


def test_the_servers_own_origin_is_its_scheme_and_host_without_a_default_port() -> None:
    assert origins.own("http", "LocalHost:80") == "http://localhost"
    assert origins.own("https", "localhost:443") == "https://localhost"
    assert origins.own("http", "localhost:443") == "http://localhost:443"
    assert origins.own("http", "[::1]:8000") == "http://[::1]:8000"
    at = {"host": "[::1]:8000"}
    assert origins.foreign({**at, "origin": "http://[::1]:8000"}, "http", []) is None
    assert origins.foreign({**at, "origin": "http://[::1]:8001"}, "http", []) == "http://[::1]:8001"
    assert origins.foreign({"origin": "http://[::1]:8000"}, "http", []) == "http://[::1]:8000"  # no Host: not ours


# --- in a real browser ------------------------------------------------------------------------------------------

ATTACK = """<!doctype html>
<meta charset="utf-8"><title>any page on the web</title>
<a id="link" href="{api}/">the playground</a>
<script>
async function send(api, tid) {{  // CORS-simple: no preflight, the browser sends each at once
  const body = new FormData();
  body.append("content", "2+2");
  await fetch(`${{api}}/threads/${{tid}}/messages`, {{ method: "POST", mode: "no-cors", body }});
  for (const path of ["/stop", "/continue", "/terminate"]) {{  // no body: these take none
    await fetch(`${{api}}/threads/${{tid}}${{path}}`, {{ method: "POST", mode: "no-cors" }});
  }}
}}
function post(api, tid) {{  // a plain HTML form, posted: a top-level navigation
  const form = document.createElement("form");
  form.method = "POST";
  form.enctype = "multipart/form-data";
  form.action = `${{api}}/threads/${{tid}}/messages`;
  const input = document.createElement("input");
  input.name = "content";
  input.value = "2+2";
  form.append(input);
  document.body.append(form);
  form.submit();
}}
</script>
"""


@pytest.fixture
def elsewhere() -> Iterator[tuple[int, list[str]]]:
    """A web server of another origin, serving the page of `ATTACK` for the API whose address goes in the list."""
    api: list[str] = []
    with processes.page_server(lambda: ATTACK.format(api=api[0]).encode()) as port:
        yield port, api


def _answers(page: Page, api: str) -> list[tuple[str, int]]:
    """What the API answered the page's requests (an opaque `no-cors` answer hides it from the page, not from us)."""
    seen: list[tuple[str, int]] = []

    def record(response: Response) -> None:
        if response.url.startswith(api):
            seen.append((f"{response.request.method} {response.url.removeprefix(api)}", response.status))

    page.on("response", record)
    return seen


@pytest.mark.slow  # a real server and Chromium
async def test_pages_of_other_origins_drive_no_thread_in_a_real_browser(
    app: FastAPI, serve: Any, elsewhere: tuple[int, list[str]]
) -> None:
    """Chromium, a page on another port of 127.0.0.1 (same site, another origin) and one on `localhost` (another
    site): its `no-cors` fetches and its form POST are 403 and change nothing; a link to the playground loads it;
    the same fetch from the server's own origin is taken."""
    api = await serve(app)
    port, address = elsewhere
    address.append(api)
    async with httpx.AsyncClient(base_url=api) as c:
        tid, _ = await _thread(c)
        before = await _state(c, tid)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium())
        try:
            for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
                page = await browser.new_page()
                answers = _answers(page, api)
                await page.goto(f"{origin}/")
                await page.evaluate("([api, tid]) => send(api, tid)", [api, tid])
                async with page.expect_navigation() as posting:
                    await page.evaluate("([api, tid]) => post(api, tid)", [api, tid])
                posted = await posting.value
                assert posted is not None and posted.status == 403
                assert "cross_origin_refused" in await page.content()
                paths = ("messages", "stop", "continue", "terminate", "messages")
                assert answers == [(f"POST /threads/{tid}/{path}", 403) for path in paths], answers
                await page.goto(f"{origin}/")
                async with page.expect_navigation() as following:
                    await page.click("#link")  # a top-level navigation from another site: the page is static
                followed = await following.value
                assert followed is not None and followed.status == 200 and followed.url == f"{api}/"
                await page.close()
            async with httpx.AsyncClient(base_url=api) as c:
                assert await _state(c, tid) == before
            page = await browser.new_page()
            answers = _answers(page, api)
            await page.goto(f"{api}/")  # the playground: the server's own origin
            async with page.expect_response(lambda r: r.url == f"{api}/threads/{tid}/messages") as taking:
                await page.evaluate(
                    """async ([api, tid]) => {
                        const body = new FormData();
                        body.append("content", "2+2");
                        await fetch(`${api}/threads/${tid}/messages`, { method: "POST", mode: "no-cors", body });
                    }""",
                    [api, tid],
                )
            assert (await taking.value).status == 202
            assert [a for a in answers if a[1] == 403] == []  # nor any call the playground made itself
            await page.close()
        finally:
            await browser.close()
    async with httpx.AsyncClient(base_url=api) as c:
        listed = (await c.get(f"/threads/{tid}/messages")).json()["messages"]
        assert [m["content"] for m in listed] == ["hi", "2+2"]
