"""The playground as a developer console (issue 35), in Debian's Chromium against `agents serve` and the example
agents: the agent map, a reply streaming in, the turn trace, Markdown, each message's source, message edits and
deletes, thread search, filters, renaming, tags and deletion, Stop only while a turn runs, and a refused key said in
place. Each step leaves a screenshot in tests/artifacts/ (CI keeps them)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page

from tests.test_playground import ARTIFACTS, _browser, _page, _server

LAUNCH = "Write the launch note for the harbour café."
CONSOLE_AGENTS = Path(__file__).parent / "fixtures" / "console_agents"  # an overloaded model, a slow one, a hook


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"console-{name}.png")


async def create(page: Page, agent: str) -> None:
    await page.wait_for_selector(f"#agent option[value={agent}]", state="attached")
    await page.select_option("#agent", agent)
    await page.click("#create")
    await page.wait_for_selector("#stream-state:has-text('live')")


async def say(page: Page, text: str) -> None:
    await page.fill("#input", text)
    await page.press("#input", "Enter")


@pytest.mark.slow  # a real server and Chromium
async def test_a_new_user_explores_the_launch_team(database_url: str, tmp_path: Path) -> None:
    """Issue 35's "done when": pick `launch`, see its map and the team it delegates to, send a message and watch the
    reply stream in, open the trace (every model call with tokens and cost, every tool with its duration), edit a
    message, and delete the thread with its subagent threads."""
    problems: list[str] = []
    async with _server(database_url, tmp_path) as server, _browser() as browser:
        page = await _page(browser, problems)
        await page.goto(f"{server.base}/")
        await page.wait_for_selector("#key-state:has-text('Open mode')")
        assert await page.is_hidden("#stop")  # no thread, nothing to stop

        # the agent map of the agent picked for a new thread
        await page.wait_for_selector("#agent option[value=launch]", state="attached")
        await page.select_option("#agent", "launch")
        await page.click("#tab-map")
        await page.wait_for_selector(".map-agent[data-agent=launch]")
        assert "Lead" in await page.inner_text(".map-side[data-side=a]")
        assert "session stop: accept" in await page.inner_text(".map-side[data-side=b]")
        lead = page.locator(".map-prompt[data-prompt=launch_lead]")
        assert "model launch_team" in await lead.inner_text()
        kinds = {
            "qa_team": ("subagent", "blocking"),
            "researcher": ("subagent", "resumable"),
            "polish": ("subprompt", None),
            "publisher": ("subagent", "optional: PUBLISH"),
        }
        for name, (kind, tag) in kinds.items():
            node = lead.locator(f".map-tool[data-tool={name}]")
            assert await node.get_attribute("data-kind") == kind
            if tag:
                assert tag in await node.inner_text()
        assert "non-blocking" in await lead.locator(".map-tool[data-tool=researcher]").inner_text()
        await page.wait_for_selector(".map-prompt[data-prompt=polish]")  # a subprompt's own card
        await shot(page, "map")
        await lead.locator(".map-tool[data-tool=qa_team] button").click()  # a subagent opens its own map
        await page.wait_for_selector(".map-agent[data-agent=qa_team]")
        await page.wait_for_selector(".map-tool[data-tool=write_draft][data-kind=tool]")
        assert "session fail: reject" in await page.inner_text(".map-side[data-side=b]")
        await page.click(".map-agent button:has-text('back')")
        await page.wait_for_selector(".map-agent[data-agent=launch]")

        # a turn: Stop while it runs, the lead's reply streaming in, each side drawn as itself
        await create(page, "launch")
        await page.click("#tab-trace")  # the trace follows the turn while it runs
        await say(page, LAUNCH)
        await page.wait_for_selector("#stop:visible")
        await page.wait_for_function(
            "() => document.querySelector('#trace .trace-entry[data-kind=tool]') "
            "&& document.querySelector('#trace-live').textContent.startsWith('●') "
            "&& ['running', 'waiting'].includes(document.querySelector('#thread-status').textContent)"
        )  # a tool's entry is drawn, and the live line says what runs, while the turn still runs
        streaming = ".msg.side-a[data-streamed=true]"
        await page.wait_for_function(
            f"() => [...document.querySelectorAll('{streaming}')].some((n) => Number(n.dataset.chunks) >= 3 "
            "&& !n.querySelector('.text').textContent.includes('Research:'))"
        )  # caught mid-reply: three deltas drawn, the end not yet there
        await shot(page, "streaming")
        await page.locator(f"{streaming} .text").filter(has_text="Launch note ready.").wait_for(timeout=30_000)
        await page.wait_for_selector("#thread-status:text-is('idle')", timeout=30_000)
        assert await page.is_hidden("#stop")
        who = await page.locator(f"{streaming} .who").first.inner_text()
        assert "Lead · side A" in who
        assert await page.locator(".msg.user[data-source=user]").filter(has_text=LAUNCH).count() == 1

        # the trace: every model call with tokens and cost, every tool with its duration, a subagent linked
        await page.click("#refresh-trace")
        turn = page.locator(".trace-turn").filter(has_text="Turn 1")
        await turn.wait_for()
        llm = turn.locator(".trace-entry[data-kind=llm]")
        tools = turn.locator(".trace-entry[data-kind=tool]")
        assert await llm.count() >= 4 and await tools.count() >= 3
        for i in range(await llm.count()):
            text = await llm.nth(i).inner_text()
            assert "launch_team" in text and " in / " in text and "$0.0" in text and "first token" in text, text
        for i in range(await tools.count()):
            assert (await tools.nth(i).locator(".trace-duration").inner_text()).endswith(" ms")
        assert "$" in await turn.locator(".trace-sum").inner_text()
        qa = tools.filter(has_text="qa_team")
        await qa.locator("button:has-text('child')").wait_for()
        first = llm.first
        await first.locator("summary:text-is('request')").click()  # the full request, on demand
        await first.locator("details.request[data-full=true] pre").wait_for()  # `agents serve`: LOG_REQUESTS=full
        shown = await first.locator("details.request pre").inner_text()
        assert '"role": "system"' in shown and '"parameters"' in shown, shown[:300]
        await shot(page, "trace")
        await qa.locator("button:has-text('child')").click()  # the subagent's own thread
        await page.wait_for_selector("#open-parent:visible")
        await page.click("#open-parent")
        await page.wait_for_selector("#delete-thread:visible")

        # edit a message: the lead's reply, through PATCH; the new text is what the page and the API show
        await page.click("#tab-thread")
        found = page.locator(".msg.side-a").filter(has_text="Launch note ready.").last
        reply = page.locator(f".msg[data-id='{await found.get_attribute('data-id')}']")  # its text turns into an editor
        await reply.hover()
        await reply.locator(".msg-actions button:text-is('edit')").click()
        await reply.locator("textarea.edit-text").fill("Launch note ready, **edited** by hand.")
        await reply.locator("button:text-is('Save')").click()
        edited = page.locator(".msg.side-a .text.markdown strong").filter(has_text="edited")
        await edited.wait_for()
        await shot(page, "edited")

        # delete the thread: the confirmation names its subagent threads; all of them go
        await page.click("#delete-thread")
        assert "subagent thread" in await page.inner_text("#delete-what")
        await shot(page, "delete-confirm")
        await page.click("#delete-yes")
        await page.wait_for_selector("#threads li:has-text('no threads yet')")
        await page.wait_for_selector("#thread-title:text-is('No thread selected')")
        await shot(page, "deleted")
    assert problems == []


@pytest.mark.slow  # a real server and Chromium
async def test_reading_and_managing_threads(database_url: str, tmp_path: Path) -> None:
    """Markdown with highlighted code, sanitized; an effect's message drawn as the effect's; a tool result refused
    alone, as the API says; renaming, tags, search and filters."""
    problems: list[str] = []
    async with _server(database_url, tmp_path) as server, _browser() as browser:
        page = await _page(browser, problems)
        await page.goto(f"{server.base}/")
        await create(page, "assistant")
        await say(page, "Show me some code")
        block = page.locator(".msg.assistant .markdown pre[data-language=python] code")
        await block.locator(".tok-keyword").filter(has_text="def").first.wait_for()
        assert await block.locator(".tok-comment").inner_text() == "# say hello"
        assert await block.locator(".tok-string").count() >= 1
        assert await page.locator(".msg.assistant .markdown strong").first.inner_text() == "Markdown"
        assert await page.locator(".msg.assistant .markdown li").count() == 2
        assert "**" not in await page.locator(".msg.assistant .text").last.inner_text()  # no raw Markdown shows
        await shot(page, "markdown")

        # in this browser: HTML in a reply shows as text, and a javascript: link is no link
        cleaned = await page.evaluate(
            """async () => {
              const { render } = await import("/playground/markdown.js");
              const box = document.createElement("div");
              box.append(render('<img src=x onerror="window.hit=1"><script>window.hit=2</script> ' +
                '[y](javascript:window.hit=3) <b style="color:red">b</b> [ok](https://example.com)'));
              document.body.append(box);
              const links = [...box.querySelectorAll("a")].map((a) => [a.getAttribute("href"), a.target, a.rel]);
              const tags = [...box.querySelectorAll("*")].map((n) => n.tagName);
              box.remove();
              return { text: box.textContent, links, tags, hit: window.hit ?? null };
            }"""
        )
        assert cleaned["hit"] is None and set(cleaned["tags"]) <= {"P", "A", "BR"}, cleaned
        assert '<img src=x onerror="window.hit=1">' in cleaned["text"] and '<b style="color:red">' in cleaned["text"]
        assert cleaned["links"] == [[None, "", ""], ["https://example.com", "_blank", "noopener noreferrer"]], cleaned

        # the trace draws what the example turns do not show: a retried call, a fallback and a hook's error
        drawn = await page.evaluate(
            """async () => {
              const trace = await import("/playground/trace.js");
              const at = (s) => `2026-01-01T00:00:0${s}Z`;
              const llm = { kind: "llm", message_id: null, provider: "test", tool: null, input_tokens: 5,
                output_tokens: 1, cached_tokens: 0, reasoning_tokens: 0, cost: null, latency_ms: 3, ttft_ms: 1,
                finish_reason: "stop", response: null, request: null, retry_of: null, fallback_of: null };
              const logs = [
                { ...llm, id: "1", model: "main", attempt: 1, status: "error", error: "overloaded", created_at: at(1) },
                { ...llm, id: "2", model: "main", attempt: 2, status: "error", error: "overloaded", retry_of: "1",
                  created_at: at(2) },
                { ...llm, id: "3", model: "backup", attempt: 1, status: "success", error: null, fallback_of: "2",
                  created_at: at(3) },
                { ...llm, id: "4", kind: "hook", model: null, tool: "redact_cards", attempt: 1, status: "error",
                  error: "boom", created_at: at(4) },
              ];
              const box = document.createElement("div");
              trace.draw(box, logs, [{ id: "u", role: "user", content: "hi", created_at: at(0) }], () => {});
              return [...box.querySelectorAll(".trace-entry")].map((e) => e.innerText.replace(/\\s+/g, " "));
            }"""
        )
        assert "overloaded" in drawn[0] and "retry" in drawn[1] and "attempt 2" in drawn[1], drawn
        assert "backup" in drawn[2] and "fallback" in drawn[2] and "no price" in drawn[2], drawn
        assert "redact_cards" in drawn[3] and "boom" in drawn[3] and "hook" in drawn[3].lower(), drawn

        # a tool call and its result; deleting the result alone is refused, said on the message itself
        await say(page, "What is 6 * 7?")
        await page.locator(".msg.assistant .text").filter(has_text="The answer is 42.").wait_for()
        tool = page.locator(".msg.tool").filter(has_text="42")
        await tool.hover()
        await tool.locator(".msg-actions button:text-is('delete')").click()
        await tool.locator(".confirm-inline button:text-is('yes')").click()
        await tool.locator(".refusal").filter(has_text="tool_result_alone").wait_for()
        assert await tool.locator(".msg-actions button:text-is('edit')").count() == 0

        # an effect: the reminder it queues is drawn as the effect's, not as the user's
        await say(page, "remind me in 1 second to stretch")
        effect = page.locator(".msg.effect[data-source=effect]").filter(has_text="Reminder: stretch")
        await effect.wait_for(timeout=20_000)
        assert "effect · remind" in await effect.locator(".who").inner_text()
        await page.locator(".msg.assistant .text").filter(has_text="Here is your reminder: stretch").wait_for()
        await shot(page, "sources")

        # rename and tag it, then find it by search, tag, status and agent
        await page.click("#edit-thread")
        await page.fill("#edit-name", "Sums and reminders")
        await page.fill("#edit-tags", "demo, maths")
        await page.click("#thread-edit button[type=submit]")
        await page.wait_for_selector("#thread-title:has-text('Sums and reminders')")
        assert await page.locator("#thread-tags .tag").all_inner_texts() == ["demo", "maths"]
        await page.click("#create")  # a second, unnamed assistant thread
        await page.wait_for_selector("#thread-title:not(:has-text('Sums'))")
        await page.select_option("#agent", "launch")
        await page.click("#create")  # and a launch thread
        await page.wait_for_selector("#thread-title:has-text('launch')")
        await page.click("#refresh-threads")
        await page.wait_for_function("() => document.querySelectorAll('#threads li[data-id]').length === 3")
        await page.fill("#thread-search", "sums")
        await page.wait_for_function("() => document.querySelectorAll('#threads li[data-id]').length === 1")
        assert "Sums and reminders" in await page.inner_text("#threads li[data-id]")
        await page.fill("#thread-search", "")
        await page.fill("#filter-tag", "maths")
        await page.wait_for_function("() => document.querySelectorAll('#threads li[data-id]').length === 1")
        await page.fill("#filter-tag", "")
        await page.select_option("#filter-agent", "launch")
        await page.wait_for_function("() => document.querySelectorAll('#threads li[data-id]').length === 1")
        await page.select_option("#filter-agent", "")
        await page.select_option("#filter-status", "terminated")
        await page.wait_for_selector("#threads li:has-text('no thread matches')")
        await page.select_option("#filter-status", "idle")
        await page.wait_for_function("() => document.querySelectorAll('#threads li[data-id]').length === 3")
        await shot(page, "threads")
    assert [p for p in problems if "409 (Conflict)" not in p] == []  # the refused delete answered 409


@pytest.mark.slow  # a real server and Chromium
async def test_a_failing_turn_and_a_stop_in_the_trace(database_url: str, tmp_path: Path) -> None:
    """A model that is overloaded: its two attempts (the second a retry) and the fallback that answers, each with its
    error or tokens and cost, and the hook that ran with its time; the whole request on demand. Then Stop clicked while
    a slow reply streams: the turn stops where it was, and the page says so."""
    problems: list[str] = []
    served = _server(database_url, tmp_path, AGENTS_DIR=str(CONSOLE_AGENTS), LLM_BACKOFF="0.05")
    async with served as server, _browser() as browser:
        page = await _page(browser, problems)
        await page.goto(f"{server.base}/")
        await create(page, "flaky")
        await page.click("#tab-trace")
        await say(page, "Hello?")
        await page.wait_for_selector(".trace-entry[data-kind=llm].success", timeout=30_000)
        await page.wait_for_selector("#thread-status:text-is('idle')")
        await page.click("#refresh-trace")
        turn = page.locator(".trace-turn").filter(has_text="Turn 1")
        await turn.wait_for()
        calls = turn.locator(".trace-entry[data-kind=llm]")
        assert await calls.count() == 3
        first, retry, fallback = [await calls.nth(i).inner_text() for i in range(3)]
        assert "overloaded" in first and "error" in first and "the model is overloaded" in first, first
        assert "retry" in retry and "attempt 2" in retry and "still overloaded" in retry, retry
        assert "backup" in fallback and "fallback" in fallback and "success" in fallback, fallback
        assert "12 in / 5 out" in fallback and "$0.000022" in fallback, fallback
        hooks = turn.locator(".trace-entry[data-kind=hook]")
        assert await hooks.count() >= 2  # the user's message and the answer went through `stamp`
        hook = await hooks.first.inner_text()
        assert "stamp" in hook and "before_create_message" in hook and "success" in hook, hook
        assert (await hooks.first.locator(".trace-duration").inner_text()).endswith(" ms")
        answered = calls.nth(2)
        await answered.locator("summary:text-is('request')").click()
        await answered.locator("details.request[data-full=true] pre").wait_for()
        shown = await answered.locator("details.request pre").inner_text()
        assert '"content": "Hello?"' in shown and '"model": "backup"' in shown, shown[:300]
        await shot(page, "failing-turn")

        # Stop while a slow reply streams: it ends where it was, the page says so, Stop hides
        await create(page, "slow")
        await page.click("#tab-thread")
        await say(page, "Tell me slowly.")
        streaming = ".msg[data-streamed=true]"
        await page.wait_for_function(
            f"() => [...document.querySelectorAll('{streaming}')].some((n) => Number(n.dataset.chunks) >= 3)"
        )
        await page.click("#stop")
        await page.wait_for_selector("#messages .line:has-text('Stopped by the user')")
        await page.wait_for_function(
            "() => !['running', 'queued'].includes(document.querySelector('#thread-status').textContent)"
        )
        await page.wait_for_selector("#stop", state="hidden")
        status = await page.inner_text("#thread-status")
        text = await page.locator(f"{streaming} .text").last.inner_text()
        assert status == "stopped" and text.startswith("A slow") and "The end." not in text, (status, text)  # cut off
        await page.wait_for_timeout(1500)  # nothing streams on after the stop
        assert await page.locator(f"{streaming} .text").last.inner_text() == text
        await shot(page, "stopped")
        async with httpx.AsyncClient(base_url=server.base) as api:
            tid = await page.evaluate("() => document.querySelector('#threads li.active')?.dataset.id")
            assert tid, "the slow thread is selected"
            thread = (await api.get(f"/threads/{tid}")).json()
            assert thread["status"] == status, (thread["status"], status)
    assert problems == []


@pytest.mark.slow  # a real server and Chromium
async def test_a_refused_key_is_explained_in_place(database_url: str, tmp_path: Path) -> None:
    """A key left in the tab for a server in open mode: the page says the key was refused and that none is needed,
    where the key and the threads are; forgetting it brings the page back."""
    problems: list[str] = []
    async with _server(database_url, tmp_path) as server, _browser() as browser:
        page = await _page(browser, problems)
        await page.goto(f"{server.base}/")
        await page.wait_for_selector("#key-state:has-text('Open mode')")
        await page.evaluate("sessionStorage.setItem('agents-playground-key', 'sa_not-a-key')")
        await page.reload()
        await page.wait_for_selector("#key-state:has-text('Key refused: this server needs none')")
        assert "it is in open mode" in await page.inner_text("#threads .refused")
        assert await page.is_visible("#key-forget") and await page.is_hidden("#notice")
        await shot(page, "refused-key")
        await page.click("#key-forget")
        await page.wait_for_selector("#key-state:has-text('Open mode')")
        await page.wait_for_selector("#threads li:has-text('no threads yet')")
    assert [p for p in problems if "401" not in p] == []
