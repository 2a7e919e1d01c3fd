"""A page on another origin talks to a real `agents serve` in headless Chromium: CORS preflights, a key in the
`Authorization` header, a stream token in the `EventSource` URL, a browser reconnect that resumes with
`Last-Event-ID`, and a page on an origin not in `CORS_ORIGINS` refused by the browser itself.

The page runs the README's two browser snippets verbatim (the stream token, and the rendering of the stream), so
the README cannot drift from what works. Chromium is Debian's (`/usr/bin/chromium`, which `.ci/run` installs);
Playwright only drives it (`playwright install` is never needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright

from tests import processes
from tests.conftest import ROOT

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 30_000  # what the page waits for an answer before it reports where it stood


def readme_snippets() -> tuple[str, str]:
    """The README's browser code: the stream-token block, and the stream-rendering block minus its same-origin
    `EventSource` line (the token block opens the stream instead)."""
    blocks = re.findall(r"```js\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    token = [b for b in blocks if "/stream-tokens" in b]
    render = [b for b in blocks if 'addEventListener("message_chunk"' in b]
    assert len(token) == 1 and len(render) == 1, "the README's stream-token and stream-rendering snippets moved"
    lines = render[0].splitlines()
    assert lines[0].startswith("const source = new EventSource(")
    return token[0], "\n".join(lines[1:])


def page_html() -> str:
    token, render = readme_snippets()
    return f"""<!doctype html>
<meta charset="utf-8"><title>a chat page on another origin</title>
<script>
const call = (api, key, method, path, body) => fetch(`${{api}}${{path}}`, {{
  method,
  headers: {{ "Authorization": `Bearer ${{key}}`, "Content-Type": "application/json" }},
  body: body === undefined ? undefined : JSON.stringify(body),
}});

async function start(api, key) {{
  const created = await call(api, key, "POST", "/threads", {{ agent: "assistant" }});
  if (created.status !== 201) throw new Error(`POST /threads: ${{created.status}} ${{await created.text()}}`);
  const threadId = (await created.json()).id;
  // ---- the README's stream-token snippet, verbatim
{token}
  // ---- the README's stream-rendering snippet, verbatim (after its EventSource line)
{render}
  // ----
  const chat = {{ api, key, threadId, source, messages, ids: [], opened: 0, turns: 0 }};
  window.chat = chat;
  for (const type of ["message_data", "turn_ended", "step_started", "step_completed", "thread_status"]) {{
    source.addEventListener(type, (e) => chat.ids.push(Number(e.lastEventId)));
  }}
  source.addEventListener("turn_ended", () => {{ chat.turns += 1; }});
  source.addEventListener("open", () => {{ chat.opened += 1; }});
  await until(() => chat.opened > 0, "the stream to open");
  return threadId;
}}

async function until(predicate, what) {{
  const deadline = Date.now() + {TIMEOUT_MS};
  while (!predicate()) {{
    if (Date.now() > deadline) {{
      throw new Error(`timed out waiting for ${{what}}: ${{JSON.stringify({{ ...window.chat, source: undefined,
        messages: [...window.chat.messages.values()], state: window.chat.source.readyState }})}}`);
    }}
    await new Promise((resolve) => setTimeout(resolve, 50));
  }}
}}

async function say(text) {{
  const chat = window.chat;
  const turns = chat.turns;
  const posted = await call(chat.api, chat.key, "POST", `/threads/${{chat.threadId}}/messages`, {{ content: text }});
  if (!posted.ok) throw new Error(`POST /messages: ${{posted.status}} ${{await posted.text()}}`);
  await until(() => chat.turns > turns, "the turn to end");
  const replies = [...chat.messages.values()].filter((m) => m.role === "assistant" && m.content);
  replies.sort((a, b) => a.created_at.localeCompare(b.created_at));
  return replies.at(-1).content;
}}

async function files() {{  // what else a page reads across origins: a file and its ETag, an error envelope
  const chat = window.chat;
  const url = `${{chat.api}}/threads/${{chat.threadId}}/fs/notes.txt`;
  const auth = {{ "Authorization": `Bearer ${{chat.key}}` }};
  const text = {{ ...auth, "Content-Type": "text/plain" }};
  const put = await fetch(url, {{ method: "PUT", headers: text, body: "hello" }});
  const got = await fetch(url, {{ headers: auth }});
  const missing = await call(chat.api, chat.key, "GET", `/threads/${{crypto.randomUUID()}}`);
  return {{ put: put.status, text: await got.text(), etag: got.headers.get("ETag"), missing: missing.status,
    code: (await missing.json()).error.code }};
}}

async function attempt(api, key) {{  // from an origin the API does not allow
  try {{
    const r = await call(api, key, "POST", "/threads", {{ agent: "assistant" }});
    return `answered ${{r.status}}`;
  }} catch (e) {{
    return `${{e.name}}: ${{e.message}}`;
  }}
}}

function listen(url) {{  // an EventSource from an origin the API does not allow: the browser fails it
  return new Promise((resolve) => {{
    const source = new EventSource(url);
    source.addEventListener("message_data", () => resolve("read an event"));
    source.addEventListener("error", () => resolve(`error, readyState ${{source.readyState}}`));
  }});
}}
</script>
"""


@pytest.fixture
def pages() -> Iterator[int]:
    """A second web server, on a port of its own, serving the chat page (at `/`) to any host name."""
    body = page_html().encode()
    with processes.page_server(lambda: body) as port:
        yield port


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: this test drives a real browser. Install it with "
            "`DEBIAN_FRONTEND=noninteractive apt-get install -y chromium` (as .ci/run does)."
        )
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


def create_key(database_url: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR")}
    created = subprocess.run(
        [sys.executable, "-m", "app", "keys", "create", "--user", "alice"],
        cwd=ROOT,
        env={**env, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return created.stdout.strip().splitlines()[-1]


async def open_page(browser: Browser, url: str) -> Page:
    page = await browser.new_page()
    await page.goto(url)
    return page


@pytest.mark.slow  # a real server and Chromium
async def test_a_page_on_another_origin_streams_a_thread_with_a_key(
    database_url: str, tmp_path: Path, pages: int, browser: Browser
) -> None:
    key = create_key(database_url)
    port = processes.free_port()
    api = f"http://127.0.0.1:{port}"
    allowed, refused = f"http://127.0.0.1:{pages}", f"http://localhost:{pages}"  # two origins, one page server
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "AGENTS_DIR")},
        "DATABASE_URL": database_url,
        "DATA_DIR": str(tmp_path),
        "PORT": str(port),
        "CORS_ORIGINS": allowed,
    }

    def serve(log: Path) -> subprocess.Popen[bytes]:
        return processes.start(["serve"], env, log)

    proc = serve(tmp_path / "first.log")
    try:
        await processes.until_ready(api, proc, tmp_path / "first.log")
        page = await open_page(browser, allowed + "/")
        thread_id = await page.evaluate("([api, key]) => start(api, key)", [api, key])
        assert await page.evaluate("(text) => say(text)", "What is 12 * (3 + 4)?") == "The answer is 84."

        # the API goes away and comes back: the browser reconnects by itself (same URL, same token) and resumes
        # after the last event it saw (`Last-Event-ID`): the next answer arrives, nothing is seen twice
        assert processes.stop(proc) == 0
        proc = serve(tmp_path / "second.log")
        await processes.until_ready(api, proc, tmp_path / "second.log")
        await page.evaluate("() => until(() => window.chat.opened > 1, 'the stream to reopen')")
        assert await page.evaluate("(text) => say(text)", "And 2 + 2?") == "The answer is 4."
        ids = await page.evaluate("() => window.chat.ids")
        assert ids == sorted(set(ids)), f"events seen twice or out of order: {ids}"
        reconnected = (tmp_path / "second.log").read_text()
        assert f"GET /threads/{thread_id}/events?token=*** HTTP/1.1" in reconnected  # the log hides the token
        token = await page.evaluate("() => new URL(window.chat.source.url).searchParams.get('token')")
        assert token and token not in reconnected and token not in (tmp_path / "first.log").read_text()
        read = await page.evaluate("() => files()")
        assert read["put"] == 201 and read["text"] == "hello" and read["etag"], read  # ETag is exposed
        assert (read["missing"], read["code"]) == (404, "thread_not_found")

        # a page on an origin not in CORS_ORIGINS: its preflight is refused, so the POST is never sent, and a
        # stream it opens (even with a valid token) is failed by the browser
        other = await open_page(browser, refused + "/")
        refusal = await other.evaluate("([api, key]) => attempt(api, key)", [api, key])
        assert refusal.startswith("TypeError"), refusal
        async with httpx.AsyncClient(base_url=api, headers={"Authorization": f"Bearer {key}"}) as client:
            listed = (await client.get("/threads")).json()
            assert [t["id"] for t in listed["threads"]] == [thread_id]
            minted = (await client.post("/stream-tokens", json={"thread_id": thread_id})).json()
        assert await other.evaluate("(url) => listen(url)", api + minted["url"]) == "error, readyState 2"
    finally:
        assert processes.stop(proc) == 0


def test_the_page_runs_the_readme_snippets() -> None:
    """The snippets the browser test runs are the README's, and they do what the README says they do."""
    token, render = readme_snippets()
    assert "Authorization" in token and "new EventSource(`${api}${minted.url}`)" in token
    assert 'addEventListener("message_data"' in render
