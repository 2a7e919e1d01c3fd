"""The JavaScript client (`clients/js/`): versioned with the server, one source for the playground's copy, every event
type typed, its `node --test` suite run against a live server, and used in Chromium from a page of another origin."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import tomllib
from asyncio.subprocess import PIPE, STDOUT
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Request, async_playwright
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import catalog, event_types, keys
from tests import processes
from tests.conftest import ROOT, client_for
from tests.test_playground import chromium

CLIENT = ROOT / "clients" / "js"
SOURCE = CLIENT / "src" / "index.js"
TYPES = CLIENT / "src" / "index.d.ts"
COPY = ROOT / "app" / "playground" / "client.js"  # what the playground serves: the package ships it
README = CLIENT / "README.md"


def node() -> str:
    """Node.js, or a skip that says how to get it (`.ci/run` installs Debian's `nodejs` when it is missing)."""
    path = shutil.which("node")
    if path is None:
        pytest.skip("node is not installed: the JS client's tests run on it (`apt-get install -y nodejs`)")
    return path


def _listed(name: str, text: str) -> list[str]:
    """The strings of the array `name = Object.freeze([...])` in the client's source."""
    found = re.search(rf"export const {name} = Object\.freeze\(\[(.*?)\]\);", text, re.DOTALL)
    assert found is not None, name
    return re.findall(r'"(\w+)"', found.group(1))


def _typed(name: str, text: str) -> list[str]:
    """The event names of the interface `name` in the declarations."""
    found = re.search(rf"export interface {name} \{{\n(.*?)\n\}}", text, re.DOTALL)
    assert found is not None, name
    return re.findall(r"^  (\w+):", found.group(1), re.MULTILINE)


def _example(language: str) -> str:
    """The client README's one code block in `language` that is an example to run (`js` with an import of the
    package, `html`)."""
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)
    found: list[str] = [b for b in blocks if "import " in b]
    assert len(found) == 1, f"the README's {language} example moved"
    return found[0]


def _browser_example(api: str, key: str) -> bytes:
    """The README's page, for this server and key."""
    page = _example("html")
    for line, value in (('const api = "http://localhost:8000";', api), ('const key = "";', key)):
        assert page.count(line) == 1, line
        page = page.replace(line, re.sub(r'"[^"]*"', f'"{value}"', line))
    return page.encode()


def test_the_client_is_versioned_with_the_server() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    package = json.loads((CLIENT / "package.json").read_text())
    assert package["version"] == version
    assert f'export const VERSION = "{version}";' in SOURCE.read_text()
    assert package["name"] == "standard-agents-client" and package["type"] == "module"
    assert package["exports"]["."] == {"types": "./src/index.d.ts", "default": "./src/index.js"}
    assert "dependencies" not in package  # none at run time


def test_the_playground_serves_the_clients_source_as_it_is() -> None:
    """One source: `clients/js/src/index.js`; the playground's `client.js` is a byte-identical copy, so that an
    installed server (which has no `clients/`) serves it."""
    assert COPY.read_bytes() == SOURCE.read_bytes(), "run `cp clients/js/src/index.js app/playground/client.js`"


async def test_the_playground_route_serves_the_client(app_factory: Any) -> None:
    app = await app_factory(catalog.load(ROOT / "agents"))
    async with client_for(app) as c:
        served = await c.get("/playground/client.js")
    assert served.status_code == 200 and served.headers["content-type"] == "text/javascript; charset=utf-8"
    assert served.content == SOURCE.read_bytes()


def test_the_client_and_its_types_know_every_event_type() -> None:
    """`EventSource` calls listeners only for the types it was told, and the typed union names each event: both
    follow the server's table."""
    source, types = SOURCE.read_text(), TYPES.read_text()
    assert sorted(_listed("THREAD_EVENTS", source)) == sorted(event_types.THREAD_EVENTS)
    assert sorted(_listed("LIFECYCLE_EVENTS", source)) == sorted(event_types.LIFECYCLE_EVENTS)
    assert sorted(_typed("ThreadEventData", types)) == sorted(event_types.THREAD_EVENTS)
    assert sorted(_typed("LifecycleEventData", types)) == sorted(event_types.LIFECYCLE_EVENTS)


async def _key(sessions: async_sessionmaker[AsyncSession]) -> str:
    """A key made before the app starts: the server requires keys from its first request."""
    async with sessions() as s, s.begin():
        _, key = await keys.create(s, "js")
    return key


@pytest.mark.slow  # node, a server and a worker in this process, an agent team's session
async def test_the_node_suite_against_a_live_server(
    app_factory: Any, serve: Any, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    """`node --test clients/js/test/` with the server's address and a key: a chat loop, a tool turn, a stream cut
    three times by a proxy and resumed without gap or duplicate, files and attachments, the variables bootstrap,
    errors. Then the README's chat loop, fed two questions."""
    runner = node()
    key = await _key(sessions)
    app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True)
    base = await serve(app)
    env = {**os.environ, "AGENTS_CLIENT_TEST_URL": base, "AGENTS_CLIENT_TEST_KEY": key}
    # a subprocess of asyncio: this event loop goes on serving the API while node runs
    proc = await asyncio.create_subprocess_exec(
        runner, "--test", "clients/js/test/", cwd=ROOT, env=env, stdout=PIPE, stderr=STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 240)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    report = out.decode()
    assert proc.returncode == 0, report
    assert re.search(r"^# fail 0$", report, re.MULTILINE) and re.search(r"^# skipped 0$", report, re.MULTILINE)
    passed = re.search(r"^# pass (\d+)$", report, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) >= 12, report

    # the README's chat loop, as it is, with the package installed where it imports it from
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "standard-agents-client").symlink_to(CLIENT)
    (tmp_path / "chat.mjs").write_text(_example("js"))
    env = {**os.environ, "AGENTS_URL": base, "AGENTS_API_KEY": key}
    chat = await asyncio.create_subprocess_exec(
        runner, "chat.mjs", cwd=tmp_path, env=env, stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    said, _ = await asyncio.wait_for(chat.communicate(b"What is 12 * (3 + 4)?\n\nAnd 2 + 2?\n"), 60)
    lines = said.decode().splitlines()
    assert chat.returncode == 0 and lines[1:] == ["The answer is 84.", "The answer is 4."], said.decode()
    assert lines[0].startswith("thread ")


PAGE = """<!doctype html>
<meta charset="utf-8"><title>a chat page on another origin</title>
<script type="module">
import { AgentsClient, AgentsError } from "/client.js";

window.chat = async (api, key, question) => {
  const client = new AgentsClient({ baseUrl: api, apiKey: key });
  const thread = await client.threads.create({ agent: "assistant" });
  const controller = new AbortController();
  let opened;
  const open = new Promise((resolve) => { opened = resolve; });
  const events = client.events.source(thread.id, { signal: controller.signal, onOpen: () => opened() });
  const seqs = [];
  let chunks = 0;
  const answer = (async () => {
    for await (const { event, seq, data } of events) {
      if (seq !== null) seqs.push(seq);
      if (event === "message_chunk") chunks += 1;
      const m = event === "message_data" ? data.data : null;
      if (m && m.role === "assistant" && m.status === "completed" && !m.tool_calls) return m.content;
    }
  })();
  await open;
  await client.messages.post(thread.id, question);
  const content = await answer;
  controller.abort();
  const missing = await client.threads.get(crypto.randomUUID()).catch((e) => e);
  return { thread: thread.id, content, seqs, chunks, error: missing instanceof AgentsError, code: missing.code };
};

window.follow = async (api, key) => {  // follow a thread for as long as the page lives; `ask` posts to it
  const client = new AgentsClient({ baseUrl: api, apiKey: key, reconnectDelay: 100 });
  const thread = await client.threads.create({ agent: "assistant" });
  const seen = { opened: 0, retried: 0, seqs: [], answers: [] };
  window.followed = seen;
  window.ask = async (question) => { await client.messages.post(thread.id, question); };
  const events = client.events.source(thread.id, { onOpen: () => seen.opened++, onRetry: () => seen.retried++ });
  (async () => {
    for await (const { event, seq, data } of events) {
      if (seq !== null) seen.seqs.push(seq);
      const m = event === "message_data" ? data.data : null;
      if (m && m.role === "assistant" && m.status === "completed" && !m.tool_calls) seen.answers.push(m.content);
    }
  })();
  return thread.id;
};
window.ready = true;
</script>
"""


@pytest.mark.slow  # a server and a worker in this process, Chromium
async def test_a_page_of_another_origin_follows_a_thread_with_the_client(
    app_factory: Any, serve: Any, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The page loads the client from its own origin, calls the API with a key (CORS preflights allow the client's
    `X-Client` header), mints a stream token and follows the thread with `EventSource` until the answer arrives.
    Then the client README's chat page, as it is, answers two questions."""
    key = await _key(sessions)
    client_js = ("text/javascript; charset=utf-8", SOURCE.read_bytes())
    example: list[bytes] = []  # the README's page, once the API's address is known
    with (
        processes.page_server(PAGE.encode, {"/client.js": client_js}) as port,
        processes.page_server(lambda: example[0], {"/standard-agents-client.js": client_js}) as readme_port,
    ):
        origin, readme = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{readme_port}"
        app = await app_factory(catalog.load(ROOT / "agents"), with_worker=True, cors_origins=[origin, readme])
        api = await serve(app)
        example.append(_browser_example(api, key))
        problems: list[str] = []
        requests: list[Request] = []
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium())
            try:
                page = await browser.new_page()
                page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
                page.on("request", lambda r: requests.append(r) if r.url.startswith(api) else None)
                await page.goto(f"{origin}/")
                await page.wait_for_function("() => window.ready === true")
                result = await page.evaluate(
                    "([api, key, question]) => chat(api, key, question)", [api, key, "What is 12 * (3 + 4)?"]
                )
                example_page = await browser.new_page()  # the README's page, asked two questions
                example_page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
                await example_page.goto(f"{readme}/")
                asked = (("What is 12 * (3 + 4)?", "The answer is 84."), ("And 2 + 2?", "The answer is 4."))
                for question, answer in asked:
                    await example_page.fill("#question", question)
                    await example_page.press("#question", "Enter")
                    await example_page.locator("#log").filter(has_text=answer).wait_for(timeout=30_000)
                logged = await example_page.inner_text("#log")
            finally:
                await browser.close()
    assert result["content"] == "The answer is 84.", result
    assert result["seqs"] == sorted(set(result["seqs"])) and result["chunks"] > 0, result
    assert (result["error"], result["code"]) == (True, "thread_not_found")
    streams = [r.url for r in requests if "/events" in r.url]
    assert streams and all(re.search(rf"/threads/{result['thread']}/events\?token=", u) for u in streams), streams
    calls = [r for r in requests if "/events" not in r.url and r.method != "OPTIONS"]
    assert calls and all(r.headers.get("x-client") == f"standard-agents-client-js/{_version()}" for r in calls)
    assert not any(key in r.url for r in requests)
    assert [p for p in problems if "status of 404" not in p] == []  # the thread asked for, the page's favicon
    assert logged.splitlines() == ["> What is 12 * (3 + 4)?", "The answer is 84.", "> And 2 + 2?", "The answer is 4."]


class Cutter:
    """A TCP proxy in front of the API that cuts every connection it carries when told, as a network would."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.slow  # a server and a worker in this process, Chromium, a stream token left to expire
async def test_in_a_browser_a_cut_stream_resumes_with_a_new_stream_token(
    app_factory: Any, serve: Any, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """`events.source` in Chromium: the connection is cut once its stream token has expired; the browser's own retry
    is refused (401), so the client mints a new token and opens the stream again after the last event it saw; the
    next answer arrives and no event is seen twice or skipped."""
    key = await _key(sessions)
    client_js = ("text/javascript; charset=utf-8", SOURCE.read_bytes())
    with processes.page_server(PAGE.encode, {"/client.js": client_js}) as port:
        origin = f"http://127.0.0.1:{port}"
        app = await app_factory(
            catalog.load(ROOT / "agents"), with_worker=True, cors_origins=[origin], stream_token_seconds=1
        )
        served = await serve(app)
        cutter = Cutter(int(served.rsplit(":", 1)[1]))
        api = await cutter.start()
        urls: list[str] = []
        try:
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=chromium())
                try:
                    page = await browser.new_page()
                    page.on("request", lambda r: urls.append(r.url) if "/events" in r.url else None)
                    await page.goto(f"{origin}/")
                    await page.wait_for_function("() => window.ready === true")
                    thread = await page.evaluate("([api, key]) => follow(api, key)", [api, key])
                    await page.wait_for_function("() => window.followed.opened === 1")
                    await page.evaluate("(q) => ask(q)", "What is 12 * (3 + 4)?")
                    await page.wait_for_function("() => window.followed.answers.length === 1")
                    await asyncio.sleep(1.2)  # the stream token is too old to open the stream again
                    cutter.cut()
                    await page.wait_for_function("() => window.followed.opened === 2", timeout=30_000)
                    await page.evaluate("(q) => ask(q)", "And 2 + 2?")
                    await page.wait_for_function("() => window.followed.answers.length === 2")
                    seen = await page.evaluate("() => window.followed")
                finally:
                    await browser.close()
        finally:
            await cutter.stop()
    assert seen["answers"] == ["The answer is 84.", "The answer is 4."], seen
    assert seen["retried"] >= 1
    seqs = seen["seqs"]
    async with (  # the stored events, read in one stream that nothing cut
        httpx.AsyncClient(base_url=served, headers={"Authorization": f"Bearer {key}"}) as c,
        c.stream("GET", f"/threads/{thread}/events") as stream,
    ):
        stored: list[int] = []
        async for line in stream.aiter_lines():
            if line.startswith("id: "):
                stored.append(int(line.removeprefix("id: ")))
                if stored[-1] >= seqs[-1]:
                    break
    assert seqs == stored, "an event seen twice, or skipped"
    resumed = [u for u in urls if "since=" in u]
    assert resumed and all(re.search(rf"/threads/{thread}/events\?token=[^&]+&since=\d+$", u) for u in resumed)


def _version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_a_missing_node_is_a_skip_that_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(Path("/nonexistent")))
    with pytest.raises(pytest.skip.Exception, match=r"node is not installed.*apt-get install -y nodejs"):
        node()
