"""The LLM call of a step, as a worker runs it: retries, the fallback chain, timeouts, log rows, events, keys."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app import db, environment, masking, tables
from app.catalog import Catalog
from app.engine import calls, transcript, types
from app.llm import retry
from app.llm.base import LLMRequest, LLMResponse, LLMTool, Usage
from app.spec import LLMMessage, ToolResult, define_agent, define_model, define_prompt
from app.spec.messages import LLMImage
from tests.conftest import client_for, wait_for
from tests.test_control import execution
from tests.test_engine import event_types, settle, stored


def catalog(*models: Any) -> Catalog:
    defined = {m.name: m for m in models}
    prompt = define_prompt(name="p", model=models[0].name, prompt="Be brief.", include_chat=True)
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(root=Path("."), models=defined, prompts={"p": prompt}, agents={"agent": agent}, tools={})


async def run(app_factory: Any, drive: Any, cat: Catalog, **settings: Any) -> tuple[httpx.AsyncClient, str]:
    """Post `hi` to a new thread and run its turn to the end (no worker: `drive`)."""
    app = await app_factory(cat, **settings)
    client = client_for(app)
    thread = (await client.post("/threads", json={"agent": "agent"})).json()
    await client.post(f"/threads/{thread['id']}/messages", json={"content": "hi"})
    await drive(app)
    await settle(client, thread["id"])
    return client, thread["id"]


async def log_rows(client: httpx.AsyncClient, tid: str) -> list[tables.Log]:
    """The thread's LLM request log rows (tool calls have rows of their own), oldest first."""
    app: Any = client._transport.app  # type: ignore[attr-defined]
    async with app.state.runtime.sessions() as session:
        query = (
            select(tables.Log)
            .where(tables.Log.thread_id == uuid.UUID(tid), tables.Log.kind == "llm")
            .order_by(tables.Log.created_at)
        )
        return list((await session.execute(query)).scalars())


async def test_a_retriable_error_is_tried_again_on_the_same_model(app_factory: Any, drive: Any) -> None:
    model = define_model(name="m", provider="test", script=[{"error": "overloaded", "status": 529}, "ok"])
    client, tid = await run(app_factory, drive, catalog(model))
    assert [m["content"] for m in await stored(client, tid)] == ["hi", "ok"]
    first, second = await log_rows(client, tid)
    assert (first.status, first.attempt, first.error, first.response) == (
        "error",
        1,
        "overloaded",
        {"kind": "server", "status": 529},
    )
    assert (second.status, second.attempt, second.retry_of, second.fallback_of) == ("success", 2, first.id, None)
    requests = [d for e, d in await event_types(client, tid) if e == "llm_request"]
    assert requests == [{"model": "m", "attempt": 1}, {"model": "m", "attempt": 2}]


async def test_a_final_error_skips_the_retry_and_walks_the_fallbacks(app_factory: Any, drive: Any) -> None:
    primary = define_model(name="m", provider="test", fallbacks=["backup"], script=[{"error": "bad", "status": 400}])
    backup = define_model(name="backup", provider="test", script=["from backup"])
    client, tid = await run(app_factory, drive, catalog(primary, backup))
    reply = (await stored(client, tid))[-1]
    assert (reply["content"], reply["model"], reply["status"]) == ("from backup", "backup", "completed")
    first, second = await log_rows(client, tid)
    assert (first.model, first.attempt, first.status) == ("m", 1, "error")
    assert (second.model, second.attempt, second.fallback_of, second.retry_of) == ("backup", 1, first.id, None)
    names = await event_types(client, tid)
    assert ("fallback_triggered", {"from": "m", "to": "backup", "error": "bad"}) in names


async def test_when_every_model_fails_the_session_fails_and_the_thread_is_idle(
    app_factory: Any, drive: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.engine.calls")
    failing = [{"error": "down", "status": 503}] * 2
    primary = define_model(name="m", provider="test", fallbacks=["backup"], script=failing)
    backup = define_model(name="backup", provider="test", script=failing)
    client, tid = await run(app_factory, drive, catalog(primary, backup))
    thread = (await client.get(f"/threads/{tid}")).json()
    assert thread["status"] == "idle"
    assert (thread["session"]["status"], thread["session"]["reason"]) == ("failure", "llm_error")
    assert [(m["role"], m["status"]) for m in await stored(client, tid)] == [
        ("user", "completed"),
        ("assistant", "failed"),
    ]
    assert [(r.model, r.attempt) for r in await log_rows(client, tid)] == [
        ("m", 1),
        ("m", 2),
        ("backup", 1),
        ("backup", 2),
    ]
    assert ("error", {"code": "llm_error", "message": "down"}) in await event_types(client, tid)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "app.engine.calls"]
    assert warned[0] == f"thread {tid}: model m (attempt 1) failed: server: down", warned  # operators see it too
    assert len(warned) == 4


async def test_a_model_that_sends_nothing_is_aborted_and_retried(app_factory: Any, drive: Any) -> None:
    model = define_model(name="m", provider="test", script=["never", "never"], delay_ms=60_000)
    client, tid = await run(app_factory, drive, catalog(model), llm_first_chunk_timeout=0.05)
    rows = await log_rows(client, tid)
    assert [(r.attempt, r.status) for r in rows] == [(1, "error"), (2, "error")]
    assert rows[0].error == "the model sent nothing for 0.05 s; the request was aborted"
    assert rows[0].response == {"kind": "timeout", "status": None}
    assert (await client.get(f"/threads/{tid}")).json()["session"]["reason"] == "llm_error"


async def test_usage_and_cost_are_logged(app_factory: Any, drive: Any) -> None:
    usage = {"input_tokens": 1000, "output_tokens": 200, "cached_tokens": 400}
    model = define_model(
        name="m",
        provider="test",
        script=[{"text": "priced", "usage": usage}],
        input_price=2.0,
        cached_price=0.5,
        output_price=10.0,
    )
    client, tid = await run(app_factory, drive, catalog(model))
    (row,) = await log_rows(client, tid)
    assert (row.input_tokens, row.output_tokens, row.cached_tokens) == (1000, 200, 400)
    assert row.cost == (600 * 2.0 + 400 * 0.5 + 200 * 10.0) / 1_000_000
    assert row.finish_reason == "stop" and row.request is not None and row.request["last"] == "hi"
    response = [d for e, d in await event_types(client, tid) if e == "llm_response"]
    assert response[0]["tokens"]["input_tokens"] == 1000 and response[0]["model"] == "m"


def test_keys_come_from_the_env_chain_then_the_process_env() -> None:
    model = define_model(name="m", provider="openai", model="gpt", api_key_env="MY_KEY")
    thread = {"MY_KEY": environment.Value("from-thread", "secret")}
    assert calls.api_key(model, types.Env(thread, {}, {}), {"MY_KEY": "from-process"}) == "from-thread"
    assert calls.api_key(model, types.Env({}, {"MY_KEY": "from-agent"}, {}), {}) == "from-agent"
    assert calls.api_key(model, types.Env({}, {}, {}), {"MY_KEY": "from-process"}) == "from-process"
    assert calls.api_key(model, types.Env({}, {}, {}), {}) is None
    default = define_model(name="a", provider="anthropic", model="claude")
    assert calls.api_key(default, types.Env({}, {}, {}), {"ANTHROPIC_API_KEY": "k"}) == "k"
    assert calls.api_key(define_model(name="t", provider="test", script=[]), types.Env({}, {}, {}), {"X": "y"}) is None


def test_scrub_and_cost_without_prices() -> None:
    assert masking.scrub("key sk-123 leaked, sk-123 again", ["sk-123", ""]) == "key *** leaked, *** again"
    model = define_model(name="m", provider="test", script=[])
    assert calls.cost(model, LLMResponse(usage=Usage(input_tokens=10))) is None


async def test_a_stop_during_the_call_never_walks_the_fallbacks(app_factory: Any) -> None:
    primary = define_model(name="m", provider="test", fallbacks=["backup"], script=["slow"], delay_ms=60_000)
    backup = define_model(name="backup", provider="test", script=["from backup"])
    app = await app_factory(catalog(primary, backup), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})

    async def calling() -> bool:
        return any(e == "llm_request" for e, _ in await event_types(client, tid))

    await wait_for(calling)
    running = execution(tid)
    assert (await client.post(f"/threads/{tid}/stop")).status_code == 200
    await asyncio.wait({running}, timeout=10)  # the call still hangs: the stop ended the execution
    assert running.done()
    names = [e for e, _ in await event_types(client, tid)]
    assert names.count("llm_request") == 1 and "fallback_triggered" not in names
    assert await log_rows(client, tid) == []


async def test_logs_route_pages_through_a_threads_requests(app_factory: Any, drive: Any) -> None:
    model = define_model(
        name="m", provider="test", script=[{"error": "busy", "status": 429}, {"error": "busy", "status": 429}]
    )
    backup = define_model(name="backup", provider="test", script=["ok"])
    model.fallbacks.append("backup")
    client, tid = await run(app_factory, drive, catalog(model, backup))
    first = (await client.get(f"/threads/{tid}/logs", params={"limit": 2})).json()
    assert [(r["model"], r["attempt"], r["status"]) for r in first["logs"]] == [("m", 1, "error"), ("m", 2, "error")]
    assert first["logs"][1]["retry_of"] == first["logs"][0]["id"]
    rest = (await client.get(f"/threads/{tid}/logs", params={"cursor": first["next_cursor"]})).json()
    assert [(r["model"], r["status"], r["fallback_of"]) for r in rest["logs"]] == [
        ("backup", "success", first["logs"][1]["id"])
    ]
    assert rest["next_cursor"] is None
    assert (await client.get(f"/threads/{tid}/logs", params={"kind": "hook"})).json()["logs"] == []
    assert (await client.get(f"/threads/{tid}/logs", params={"cursor": "nope"})).status_code == 400
    assert (await client.get(f"/threads/{tid}/logs", params={"kind": "other"})).status_code == 422
    missing = await client.get(f"/threads/{uuid.uuid4()}/logs")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "thread_not_found"


async def test_reasoning_is_stored_and_replayed_only_to_the_prompt_that_produced_it(
    app_factory: Any, drive: Any
) -> None:
    seen: list[list[tuple[str | None, str | None]]] = []

    def respond(request: LLMRequest) -> Any:
        seen.append([(m.reasoning, m.content) for m in request.messages if m.role == "assistant"])
        return {"text": f"answer {len(seen)}", "reasoning": f"thought {len(seen)}"}

    model = define_model(name="m", provider="test", respond=respond)
    client, tid = await run(app_factory, drive, catalog(model))
    await client.post(f"/threads/{tid}/messages", json={"content": "again"})
    await drive(client._transport.app)  # type: ignore[attr-defined]
    await settle(client, tid)
    assert seen[1] == [("thought 1", "answer 1")]
    assert (await stored(client, tid))[1]["reasoning_content"] == "thought 1"

    rows = [
        tables.Message(
            role="assistant",
            side="a",
            content="x",
            position=1,
            status="completed",
            depth=0,
            prompt="other",
            reasoning_content="private",
            reasoning_details=[{"type": "thinking"}],
            tool_calls=None,
        )
    ]
    (message,) = transcript.history(rows, "a", catalog(model).prompts["p"], 0)
    assert (message.reasoning, message.reasoning_details) == (None, None)


async def test_the_suite_never_reaches_a_real_provider() -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(RuntimeError, match="tried to reach the network"):
            await client.post("https://api.openai.com/v1/chat/completions", json={})


async def test_a_call_redone_after_a_lost_lease_takes_the_same_script_entry(
    app_factory: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model answers, then the lease is lost before that answer is stored: nothing of the call may be committed
    (its log row is the `test` provider's script position), so the worker that runs the step again gets the same
    script entry, and the thread logs one request."""
    original = calls.Caller.call
    stolen: list[uuid.UUID] = []

    async def lease_lost_after_the_answer(self: calls.Caller, *args: Any, **kwargs: Any) -> calls.Result:
        result = await original(self, *args, **kwargs)
        if not stolen:  # another worker takes the lease while this one holds the answer
            conn = await db.connect(database_url)
            try:
                thread_id = args[1]
                token = await conn.fetchval(
                    "UPDATE leases SET token = gen_random_uuid() WHERE thread_id = $1 RETURNING token", thread_id
                )
                await conn.execute("UPDATE threads SET lease_token = $2 WHERE id = $1", thread_id, token)
            finally:
                await conn.close()
            stolen.append(thread_id)
        return result

    monkeypatch.setattr(calls.Caller, "call", lease_lost_after_the_answer)
    model = define_model(name="m", provider="test", script=["the first entry", "the second entry"])
    app = await app_factory(catalog(model), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
    await wait_for(lambda: _ready(bool(stolen)))
    async with app.state.runtime.sessions() as session:
        logged = select(func.count()).select_from(tables.Log).where(tables.Log.thread_id == uuid.UUID(tid))
        assert await session.scalar(logged) == 0  # nothing of the call was committed
    conn = await db.connect(database_url)
    try:  # the thief dies: its lease expires and the worker claims the thread again
        await conn.execute("UPDATE leases SET expires_at = now() - interval '1 second' WHERE thread_id = $1", stolen[0])
    finally:
        await conn.close()
    await settle(client, tid)
    assert [(m["role"], m["content"]) for m in await stored(client, tid)] == [
        ("user", "hi"),
        ("assistant", "the first entry"),
    ]
    [row] = await log_rows(client, tid)
    assert (row.kind, row.status, row.attempt) == ("llm", "success", 1)


async def _ready(value: bool) -> bool:
    return value


@pytest.mark.parametrize(
    ("prices", "usage", "usd"),
    [
        ({"input_price": 2.0, "output_price": 8.0}, Usage(input_tokens=1_000_000, output_tokens=500_000), 6.0),
        # cached input at its own price; the rest of the input at the input price
        (
            {"input_price": 2.0, "output_price": 8.0, "cached_price": 0.5},
            Usage(input_tokens=1_000_000, cached_tokens=400_000),
            0.6 * 2.0 + 0.4 * 0.5,
        ),
        ({"input_price": 2.0}, Usage(input_tokens=500_000, cached_tokens=500_000), 1.0),  # no cached price: input's
        ({"input_price": 1.0, "cached_price": 0.0}, Usage(input_tokens=10, cached_tokens=99), 0.0),  # capped at input
        ({"output_price": 4.0}, Usage(input_tokens=1_000_000, output_tokens=250_000), 1.0),  # only output priced
    ],
)
def test_cost_in_usd_from_prices_per_million_tokens(prices: dict[str, float], usage: Usage, usd: float) -> None:
    model = define_model(name="m", provider="test", script=[], **prices)
    assert calls.cost(model, LLMResponse(usage=usage)) == pytest.approx(usd)


def test_scrub_result_masks_every_text_field_and_the_error_data() -> None:
    result = ToolResult(
        status="error", result="r sk-1", error="e sk-1", stack="at sk-1", error_data={"sk-1": ["sk-1", 3]}
    )
    masked = calls.scrub_result(result, ["sk-1"])
    assert (masked.result, masked.error, masked.stack) == ("r ***", "e ***", "at ***")
    assert masked.error_data == {"***": ["***", 3]}
    assert result.error == "e sk-1"  # a copy: the tool's own object is left alone
    assert calls.scrub_result(result, []) is result


@pytest.mark.parametrize(
    ("response", "is_empty"),
    [
        (LLMResponse(text=""), True),
        (LLMResponse(text=" \n\t"), True),
        (LLMResponse(text="ok"), False),
        (
            LLMResponse(
                text="", tool_calls=[{"id": "c", "type": "function", "function": {"name": "t", "arguments": ""}}]
            ),
            False,
        ),
    ],
)
def test_an_answer_without_text_or_tool_calls_is_empty(response: LLMResponse, is_empty: bool) -> None:
    assert retry.empty(response) is is_empty


def test_the_full_request_masks_secrets_everywhere_and_gives_an_images_size() -> None:
    image = LLMImage(mime_type="image/png", data="QUJD" * 100, path="/uploads/a.png")
    request = LLMRequest(
        model="m",
        messages=[
            LLMMessage(role="system", content="key sk-live-1"),
            LLMMessage(role="user", content="look", images=[image]),
            LLMMessage(role="tool", content="echo sk-live-1", tool_call_id="c1", name="echo"),
        ],
        tools=[LLMTool(name="echo", description="says sk-live-1 back", parameters={"type": "object"})],
        provider_options={"user": "sk-live-1"},
        max_tokens=50,
    )
    full = calls.full_request(request, ["sk-live-1"])
    assert "sk-live-1" not in repr(full)
    assert [m["content"] for m in full["messages"]] == ["key ***", "look", "echo ***"]
    assert full["messages"][1]["images"] == [
        {"mime_type": "image/png", "data": "<300 bytes of base64>", "url": None, "path": "/uploads/a.png"}
    ]
    assert full["tools"][0] == {"name": "echo", "description": "says *** back", "parameters": {"type": "object"}}
    assert (full["provider_options"], full["max_tokens"], full["model"]) == ({"user": "***"}, 50, "m")
    assert image.data == "QUJD" * 100  # the request sent is left as it was


def test_the_full_request_is_what_asdict_gives_with_the_images_data_as_its_size() -> None:
    """Built field by field for speed, the full request must keep every field `dataclasses.asdict` would (a field
    added to a message or a request later shows here)."""
    image = LLMImage(mime_type="image/png", data="QUJD", url=None, path="/uploads/a.png")
    call = {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
    request = LLMRequest(
        model="m",
        messages=[
            LLMMessage(role="user", content="look", images=[image, LLMImage(mime_type="image/jpeg", url="https://x")]),
            LLMMessage(
                role="assistant",
                content=None,
                tool_calls=[call],  # type: ignore[list-item]
                reasoning="r",
                reasoning_details=[{"type": "x"}],
            ),
            LLMMessage(role="tool", content="ok", tool_call_id="c1", name="echo"),
        ],
        tools=[LLMTool(name="echo", description="d", parameters={"type": "object"})],
        tool_choice="auto",
        parallel_tool_calls=True,
        reasoning={"effort": "low"},
        provider_options={"user": "u"},
        max_tokens=50,
    )
    expected = dataclasses.asdict(request)
    expected["messages"][0]["images"][0]["data"] = "<3 bytes of base64>"
    assert calls.full_request(request, []) == expected
    assert calls.full_request(request, ["not-there"]) == expected
