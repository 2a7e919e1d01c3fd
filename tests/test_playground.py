"""The playground (`app/api/routes/playground.py`, the page in `app/playground/`): served as configured with a strict
policy and no data, and used in a real browser (Debian's chromium, driven by Playwright) against `agents serve`."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tomllib
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from playwright.async_api import Browser, Page, async_playwright

from app import catalog, keys
from app.api.routes import playground
from tests import processes
from tests.conftest import ROOT, client_for, wait_for

ARTIFACTS = ROOT / "tests" / "artifacts"  # screenshots CI keeps (git-ignored)
PAGE = ROOT / "app" / "playground"


CHROMIUM = Path("/usr/bin/chromium")


def chromium() -> str:
    """Debian's chromium: the tests fail (not skip) without it, so CI cannot pass without the browser run."""
    path = shutil.which("chromium") or (str(CHROMIUM) if CHROMIUM.exists() else None)
    if path is None:
        pytest.fail(
            "chromium is not installed, and the playground tests drive it: `apt-get install -y chromium` "
            "(Debian; .ci/run does it). Playwright's own browser download is not used (never `playwright install`)."
        )
    return path


def test_without_chromium_the_browser_tests_fail_and_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(f"{__name__}.CHROMIUM", Path("/nonexistent/chromium"))
    with pytest.raises(pytest.fail.Exception, match=r"chromium is not installed.*apt-get install -y chromium"):
        chromium()


# --- the page as the server serves it ------------------------------------------------------------------------


async def test_the_page_is_static_and_its_policy_allows_only_the_servers_own_files(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    async with client_for(app) as c:
        page = await c.get("/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self';" in policy and "'unsafe-inline'" not in policy
        assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
        html = page.text
        scripts = re.findall(r"<script\b[^>]*>", html)
        assert scripts == ['<script type="module" src="/playground/app.js">']  # no inline script
        assert "<style" not in html and " style=" not in html and not re.search(r"\son[a-z]+=", html)
        for path, media in (
            ("/playground/app.js", "text/javascript; charset=utf-8"),
            ("/playground/style.css", "text/css; charset=utf-8"),
            ("/playground/icon.svg", "image/svg+xml"),
            ("/playground/markdown.js", "text/javascript; charset=utf-8"),
            ("/playground/vendor/purify.es.mjs", "text/javascript; charset=utf-8"),
            ("/playground/vendor/LICENSE-marked.txt", "text/plain; charset=utf-8"),
        ):
            asset = await c.get(path)
            assert asset.status_code == 200 and asset.headers["content-type"] == media, path
            assert asset.headers["content-security-policy"] == policy
        assert (await c.get("/playground/../app/settings.py")).status_code == 404
        assert (await c.get("/playground/nope.js")).status_code == 404
        assert "/" not in (await c.get("/openapi.json")).json()["paths"]  # not part of the API
    for script in PAGE.glob("*.js"):  # server text is set as textContent, or as nodes DOMPurify returns
        assert "innerHTML" not in script.read_text(), script.name


async def test_the_page_holds_no_data_and_weakens_no_check(app_factory: Any) -> None:
    """The page needs no key (it holds nothing), every call it makes does; open mode refuses another `Host` for the
    page too, as for the API."""
    app = await app_factory(catalog.load(ROOT / "agents"))
    async with client_for(app) as c:
        for path in ("/", "/playground/app.js"):
            refused = await c.get(path, headers={"host": "evil.example.com"})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"
        assert (await c.get("/", headers={"host": "localhost:8000"})).status_code == 200
        async with app.state.runtime.sessions() as s, s.begin():
            await keys.create(s, "alice")
        assert (await c.get("/")).status_code == 200
        await wait_for(lambda: _status(c, "/agents", 401))  # keys exist (the server hears of it within moments)
        assert (await c.get("/", headers={"host": "agents.example.com"})).status_code == 200  # nothing to steal


async def _status(c: httpx.AsyncClient, path: str, status: int) -> bool:
    return (await c.get(path)).status_code == status


async def test_the_playground_can_be_turned_off(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"), playground=False)
    async with client_for(app) as c:
        for path in ("/", "/playground/app.js"):
            assert (await c.get(path)).status_code == 404


def test_every_file_of_the_page_is_package_data() -> None:
    """A non-editable install has the page: each file matches a `package-data` pattern and is one the route serves."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["app"]
    names = sorted(str(p.relative_to(PAGE)) for p in PAGE.rglob("*") if p.is_file())
    assert names == sorted(playground.ASSETS)
    for name in names:
        assert any(Path("playground", name).match(pattern) for pattern in patterns), name


def test_the_vendored_scripts_are_the_npm_packages_files() -> None:
    """Each vendored file is the one vendor/README.md names (its SHA-256), with its licence beside it."""
    table = (PAGE / "vendor" / "README.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` ([\d.]+) \|.*\| `([0-9a-f]{64})` \|$", table, re.MULTILINE)
    assert {row[0] for row in rows} == {"marked.esm.js", "purify.es.mjs"}
    for name, package, version, digest in rows:
        data = (PAGE / "vendor" / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, name
        assert version.encode() in data[:400], (name, version)  # the file's own banner names its version
        assert (PAGE / "vendor" / f"LICENSE-{package}.txt").is_file()


# --- the page in a browser -----------------------------------------------------------------------------------


class Server:
    """`agents serve` on loopback and a fresh database: its URL, and a key when one was made."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.port = processes.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.key = ""
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = processes.start(["serve", "--port", str(self.port)], self.env, self.log)
        await processes.until_ready(self.base, self.proc, self.log)

    def stop(self) -> None:
        if self.proc is not None:
            assert processes.stop(self.proc) == 0, self.log.read_text()
            self.proc = None


@asynccontextmanager
async def _server(
    database_url: str, tmp_path: Path, key_for: str | None = None, unset: tuple[str, ...] = (), **extra: str
) -> AsyncIterator[Server]:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR", "PLAYGROUND", *unset)}
    env |= {"DATABASE_URL": database_url, "DATA_DIR": str(tmp_path), "POLL_INTERVAL": "0.2", **extra}
    server = Server(env, tmp_path / "serve.log")
    if key_for:
        created = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app", "keys", "create", "--user", key_for, cwd=ROOT, env=env, stdout=PIPE
        )
        out, _ = await created.communicate()
        assert created.returncode == 0
        server.key = out.decode().strip().splitlines()[-1]
    await server.start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def _browser() -> AsyncIterator[Browser]:
    path = chromium()
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=path)
        try:
            yield browser
        finally:
            await browser.close()


async def _page(browser: Browser, problems: list[str]) -> Page:
    page = await browser.new_page(viewport={"width": 1400, "height": 860})
    page.set_default_timeout(20_000)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    return page


async def _chat(page: Page) -> None:
    """Create an `assistant` thread, ask it to calculate: the tool call, its result and the streamed answer show."""
    await page.wait_for_selector("#agent option[value=assistant]", state="attached")
    await page.select_option("#agent", "assistant")
    await page.click("#create")
    await page.wait_for_selector("#threads li.active")
    await page.wait_for_selector("#stream-state:has-text('live')")
    await page.fill("#input", "What is 12 * (3 + 4)?")
    await page.press("#input", "Enter")
    await page.wait_for_selector(".msg.user .text:has-text('What is 12 * (3 + 4)?')")
    call = page.locator(".call[data-call-id]")
    await call.filter(has_text="calculate").wait_for()
    assert "12 * (3 + 4)" in await call.inner_text()
    await page.wait_for_selector(".msg.tool .text:text-is('84')")
    answer = page.locator(".msg.assistant[data-streamed=true] .text")  # built from `message_chunk` deltas
    await answer.filter(has_text="The answer is 84.").wait_for()
    await page.wait_for_selector(".call[data-state=success]")
    await page.wait_for_selector("#thread-status:text-is('idle')")


@pytest.mark.slow  # a real server and Chromium
async def test_the_playground_in_open_mode(database_url: str, tmp_path: Path) -> None:
    problems: list[str] = []
    async with _server(database_url, tmp_path) as server, _browser() as browser:
        base = server.base
        page = await _page(browser, problems)
        await page.goto(f"{base}/")
        await page.wait_for_selector("#key-state:has-text('Open mode')")
        await _chat(page)
        await page.fill("#input", "Write a report")
        await page.press("#input", "Enter")
        await page.locator("#files .path").filter(has_text="/reports/conversation-report.md").wait_for()
        async with page.expect_download() as downloading:
            await page.locator("#files li", has_text="conversation-report.md").get_by_role("button").click()
        download = await downloading.value
        assert download.suggested_filename == "conversation-report.md"
        assert "Conversation report" in Path(await download.path()).read_text()
        Image.new("RGB", (300, 200), (240, 140, 0)).save(tmp_path / "orange.png")
        await page.set_input_files("#files-input", str(tmp_path / "orange.png"))
        await page.fill("#input", "Here is a picture")
        await page.press("#input", "Enter")  # a multipart message: the text and the file
        await page.wait_for_function(
            "() => [...document.querySelectorAll('.msg.user .attachments img')].some((i) => i.naturalWidth > 0)"
        )
        await page.locator("#files .path").filter(has_text="/attachments/orange-").wait_for()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=ARTIFACTS / "playground-open.png")
        assert await page.locator("#threads li").count() == 1
    assert problems == []


@pytest.mark.slow  # a real server and Chromium
async def test_the_playground_with_an_api_key(database_url: str, tmp_path: Path) -> None:
    """The pasted key authorises every call, stays in this tab's sessionStorage, and never goes in a URL: the stream
    opens with a stream token, minted again when the old one is refused (here after a server restart). Thumbnails are
    fetched with the key too."""
    problems: list[str] = []
    async with _server(database_url, tmp_path, "alice", STREAM_TOKEN_SECONDS="2") as server, _browser() as browser:
        base, key = server.base, server.key
        page = await _page(browser, problems)
        urls: list[str] = []
        page.on("request", lambda request: urls.append(request.url))
        await page.goto(f"{base}/")
        await page.wait_for_selector("#key-state:has-text('needs an API key')")
        problems.clear()  # the 401 of the first /agents, before a key was given
        await page.fill("#key-input", key)
        await page.click("#key-use")
        await page.wait_for_selector(f"#key-state:has-text('{key[:10]}')")
        assert await page.evaluate("sessionStorage.getItem('agents-playground-key')") == key
        assert await page.evaluate("localStorage.length") == 0
        await _chat(page)
        assert any(re.search(r"/threads/[0-9a-f-]+/events\?token=", url) for url in urls), urls
        assert not any(key in url for url in urls)
        thread = (await page.get_attribute("#thread-title", "title")) or ""
        picture = io.BytesIO()
        Image.new("RGB", (640, 400), (59, 91, 219)).save(picture, "PNG")
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
            stored = await c.put(f"/threads/{thread}/fs/pics/blue.png", content=picture.getvalue())
            assert stored.status_code == 201, stored.text
        await page.click("#refresh-files")
        thumb = page.locator("#files li[data-path='/pics/blue.png'] img.thumb")
        await thumb.wait_for()
        await page.wait_for_function(
            "() => document.querySelector(\"#files li[data-path='/pics/blue.png'] img\")?.naturalWidth > 0"
        )
        assert (await thumb.get_attribute("src") or "").startswith("blob:")
        await page.reload()  # the key stays for the tab, and the thread from the address
        await page.wait_for_selector(f"#key-state:has-text('{key[:10]}')")
        await page.wait_for_selector(".msg.assistant .text:has-text('The answer is 84.')")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=ARTIFACTS / "playground-key.png")
        await asyncio.sleep(2)  # the stream token is now too old to open the stream again
        server.stop()
        await page.wait_for_selector("#stream-state:has-text('reconnecting')")
        await server.start()  # the browser's retry is refused (401): the page mints a new token and resumes
        await page.wait_for_selector("#stream-state:has-text('live')")
        await page.fill("#input", "What is 6 * 7?")
        await page.press("#input", "Enter")
        await page.locator(".msg.assistant[data-streamed=true] .text").filter(has_text="The answer is 42.").wait_for()
        assert len({url for url in urls if "/events?token=" in url and "since=" in url}) >= 1
        await page.click("#key-forget")
        await page.wait_for_selector("#key-state:has-text('needs an API key')")
        assert await page.evaluate("sessionStorage.length") == 0
    assert [p for p in problems if "401" not in p and "ERR_CONNECTION_REFUSED" not in p] == []


@pytest.mark.slow  # a real server and Chromium
async def test_a_failed_answer_shows_why(database_url: str, tmp_path: Path) -> None:
    """`AGENTS_PROVIDER=openai` without `OPENAI_API_KEY`: the assistant's call fails at once (no network), and its
    failed message shows the error it stored, during the chat and after a reload (read back from `GET /messages`)."""
    problems: list[str] = []
    unset = ("OPENAI_API_KEY", "AGENTS_MODEL", "AGENTS_BASE_URL")
    async with _server(database_url, tmp_path, unset=unset, AGENTS_PROVIDER="openai") as server, _browser() as browser:
        page = await _page(browser, problems)
        await page.goto(f"{server.base}/")
        await page.wait_for_selector("#agent option[value=assistant]", state="attached")
        await page.select_option("#agent", "assistant")
        await page.click("#create")
        await page.wait_for_selector("#stream-state:has-text('live')")
        await page.fill("#input", "What is 12 * (3 + 4)?")
        await page.press("#input", "Enter")
        shown = page.locator(".msg.assistant.failed .error")
        await shown.filter(has_text="OPENAI_API_KEY").wait_for()
        assert (await shown.inner_text()).endswith("(llm_error)")
        await page.locator(".line.error").filter(has_text="OPENAI_API_KEY").wait_for()  # the `error` event
        assert "live" in await page.inner_text("#stream-state")  # news of the thread, not a broken connection
        await page.reload()  # what is stored says it too
        await page.locator(".msg.assistant.failed .error").filter(has_text="OPENAI_API_KEY").wait_for()
        await page.wait_for_selector("#stream-state:has-text('live')")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=ARTIFACTS / "playground-failed.png")
    assert problems == []


@pytest.mark.slow  # a real server and Chromium
async def test_a_scoped_variables_request_is_answered_from_the_page(database_url: str, tmp_path: Path) -> None:
    """The `launch` example with `PUBLISH=yes`: the publisher's request shows as a form; answering it starts the
    publisher, which appears in the subagent tree."""
    problems: list[str] = []
    async with _server(database_url, tmp_path) as server, _browser() as browser:
        base = server.base
        page = await _page(browser, problems)
        await page.goto(f"{base}/")
        await page.wait_for_selector("#agent option[value=launch]", state="attached")
        await page.select_option("#agent", "launch")
        await page.fill("#thread-env", "PUBLISH=yes")
        await page.click("#create")
        await page.wait_for_selector("#stream-state:has-text('live')")
        await page.fill("#input", "Write the launch note for the harbour café.")
        await page.press("#input", "Enter")
        await page.fill(".request input[name=CMS_TOKEN]", "tok-123", timeout=30_000)
        await page.click(".request button[type=submit]")
        await page.wait_for_selector(".request.done")
        await page.locator("#tree li").filter(has_text="Publisher").wait_for()
        await page.locator(".msg.silent .text").filter(has_text="Published the launch note").wait_for()
        for name in ("Researcher", "QA team"):
            await page.locator("#tree li").filter(has_text=name).wait_for()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=ARTIFACTS / "playground-subagents.png")
        await page.locator("#tree button").filter(has_text="Publisher").click()  # a child is a thread to open
        await page.wait_for_selector("#open-parent:visible")
    assert problems == []
