"""Real provider adapters driven by the worker, at the wire level (`httpx.MockTransport`): the stream becomes
`message_chunk` events and stored messages, keys come from the thread's env, errors are retried or surfaced."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from app.catalog import Catalog
from app.engine.calls import FLUSH_SECONDS
from app.spec import define_agent, define_model, define_prompt
from tests.conftest import client_for, wait_for
from tests.test_api import read_events, turn
from tests.test_calls import log_rows
from tests.test_engine import event_types, settle, stored
from tests.tools import add


def catalog(*extra: Any, fallbacks: list[str] | None = None, use: str = "gpt") -> Catalog:
    model = define_model(
        name="gpt", provider="openai", model="gpt-test", api_key_env="MY_KEY", fallbacks=fallbacks or []
    )
    models = {m.name: m for m in (model, *extra)}
    prompt = define_prompt(
        name="p", model=use, prompt="Add.", include_chat=True, include_past_tools=True, tools=["add"]
    )
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(root=Path("."), models=models, prompts={"p": prompt}, agents={"agent": agent}, tools={"add": add})


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def text_stream(text: str, size: int = 4) -> bytes:
    parts = [{"choices": [{"index": 0, "delta": {"content": text[i : i + size]}}]} for i in range(0, len(text), size)]
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 5}}
    return sse(*parts, done, usage)


def tool_stream() -> bytes:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2,'}}
    more = {"index": 0, "function": {"arguments": ' "b": 3}'}}
    return sse(
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [more]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )


class Wire:
    """A mock OpenAI server: answers requests in order with the given handlers, records what it was sent."""

    def __init__(self, *answers: Callable[[httpx.Request], httpx.Response] | httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[float, httpx.Request, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((time.monotonic(), request, json.loads(request.content)))
        answer = self.answers[len(self.requests) - 1]
        return answer(request) if callable(answer) else answer

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))


def ok(body: bytes) -> httpx.Response:
    """The stream, an event per network read (a model slower than the network: the adapter merges what one read
    carries)."""

    async def reads() -> AsyncIterator[bytes]:
        for event in body.split(b"\n\n")[:-1]:
            yield event + b"\n\n"

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=reads())


async def start(app_factory: Any, cat: Catalog, wire: Wire, **settings: Any) -> tuple[Any, httpx.AsyncClient, str]:
    app = await app_factory(cat, with_worker=True, http=wire.client(), **settings)
    client = client_for(app)
    created = await client.post(
        "/threads", json={"agent": "agent", "env": {"MY_KEY": "sk-thread-secret"}, "secrets": ["MY_KEY"]}
    )
    return app, client, created.json()["id"]


async def test_a_streamed_tool_call_and_reply_over_the_wire(app_factory: Any, serve: Any) -> None:
    wire = Wire(ok(tool_stream()), ok(text_stream("The sum is 5.")))
    app, client, tid = await start(app_factory, catalog(), wire)
    base = await serve(app)
    reader = asyncio.create_task(read_events(base, f"/threads/{tid}/events", "turn_ended"))
    await wait_for(lambda: asyncio.sleep(0, app.state.runtime.hub.subscribers == 1), interval=0.01)  # subscribed
    await client.post(f"/threads/{tid}/messages", json={"content": "2 + 3?"})
    frames = await asyncio.wait_for(reader, 15)
    chunks = [f["data"] for f in frames if f["event"] == "message_chunk"]
    assert "".join(c["chunk"] for c in chunks) == "The sum is 5."
    assert [c["offset"] for c in chunks] == [0, 4, 8, 12]

    rows = await stored(client, tid)
    assert [(r["role"], r["content"]) for r in rows] == [
        ("user", "2 + 3?"),
        ("assistant", None),
        ("tool", "5"),
        ("assistant", "The sum is 5."),
    ]
    assert rows[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    (_, first, body1), (_, _, body2) = wire.requests
    assert first.url == "https://api.openai.com/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer sk-thread-secret"  # from the thread's secret env
    assert body1["model"] == "gpt-test" and body1["tools"][0]["function"]["name"] == "add"
    assert body1["parallel_tool_calls"] is False  # the spec's default for `parallelToolCalls`
    assert body2["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": rows[1]["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    logs = await log_rows(client, tid)
    assert [(r.provider, r.status, r.finish_reason) for r in logs] == [
        ("openai", "success", "tool_calls"),
        ("openai", "success", "stop"),
    ]
    assert logs[1].input_tokens == 20 and logs[1].output_tokens == 5


async def test_retry_after_is_honoured(app_factory: Any) -> None:
    # 0.15 s: 15 times the backoff it replaces (`llm_backoff`, 0.01 s here)
    limited = httpx.Response(429, headers={"retry-after": "0.15"}, json={"error": {"message": "slow down"}})
    wire = Wire(limited, ok(text_stream("fine")))
    _, client, tid = await start(app_factory, catalog(), wire)
    await turn(client, tid, "hi")
    assert (await stored(client, tid))[-1]["content"] == "fine"
    (t1, _, _), (t2, _, _) = wire.requests
    assert t2 - t1 >= 0.15
    first, second = await log_rows(client, tid)
    assert (first.status, first.response) == ("error", {"kind": "rate_limited", "status": 429})
    assert second.retry_of == first.id


async def test_a_refused_key_fails_the_session_naming_the_variable_not_the_key(app_factory: Any) -> None:
    refused = httpx.Response(401, json={"error": {"message": "Incorrect API key provided: sk-thre***cret"}})
    wire = Wire(refused)
    _, client, tid = await start(app_factory, catalog(), wire)
    thread = await turn(client, tid, "hi")
    assert len(wire.requests) == 1  # an auth error is not retried
    assert thread["session"]["reason"] == "llm_error"
    error = next(d for e, d in await event_types(client, tid) if e == "error")
    assert "MY_KEY" in error["message"] and "sk-thread" not in error["message"]
    (row,) = await log_rows(client, tid)
    assert row.error is not None and "sk-thread" not in row.error and "MY_KEY" in row.error


async def test_a_stalled_stream_is_aborted_and_retried(app_factory: Any) -> None:
    async def stalls() -> AsyncIterator[bytes]:
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        await asyncio.sleep(30)

    wire = Wire(lambda _: httpx.Response(200, content=stalls()), ok(text_stream("Hello")))
    _, client, tid = await start(app_factory, catalog(), wire, llm_stall_timeout=0.15)
    await turn(client, tid, "hi")
    assert (await stored(client, tid))[-1]["content"] == "Hello"
    first, second = await log_rows(client, tid)
    assert first.error == "the model stalled for 0.15 s; the request was aborted" and second.status == "success"


async def test_the_fallback_chain_crosses_providers(app_factory: Any) -> None:
    backup = define_model(name="backup", provider="test", script=["from the backup"])
    down = httpx.Response(503, json={"error": {"message": "unavailable"}})
    wire = Wire(down, down)
    _, client, tid = await start(app_factory, catalog(backup, fallbacks=["backup"]), wire)
    await turn(client, tid, "hi")
    reply = (await stored(client, tid))[-1]
    assert (reply["content"], reply["model"]) == ("from the backup", "backup")
    fallback = next(d for e, d in await event_types(client, tid) if e == "fallback_triggered")
    assert fallback["from"] == "gpt" and fallback["to"] == "backup"
    assert [(r.model, r.attempt, r.status) for r in await log_rows(client, tid)] == [
        ("gpt", 1, "error"),
        ("gpt", 2, "error"),
        ("backup", 1, "success"),
    ]


def anthropic_stream(*blocks: dict[str, Any], stop: str) -> bytes:
    """A Messages API event stream for `blocks` (each `{"start": {...}, "deltas": [...]}`)."""
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}})
    ]
    for index, block in enumerate(blocks):
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block["start"]})
        )
        for delta in block["deltas"]:
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 12}})
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


async def test_anthropic_thinking_is_replayed_with_its_signature_after_a_tool_call(app_factory: Any) -> None:
    thinking = {
        "start": {"type": "thinking", "thinking": ""},
        "deltas": [
            {"type": "thinking_delta", "thinking": "2 plus 3"},
            {"type": "signature_delta", "signature": "sig-1"},
        ],
    }
    tool = {
        "start": {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}},
        "deltas": [{"type": "input_json_delta", "partial_json": '{"a": 2, "b": 3}'}],
    }
    text = {"start": {"type": "text", "text": ""}, "deltas": [{"type": "text_delta", "text": "It is 5."}]}
    wire = Wire(ok(anthropic_stream(thinking, tool, stop="tool_use")), ok(anthropic_stream(text, stop="end_turn")))
    claude = define_model(name="claude", provider="anthropic", model="claude-test", api_key_env="MY_KEY")
    _, client, tid = await start(app_factory, catalog(claude, use="claude"), wire)
    await turn(client, tid, "2 + 3?")
    rows = await stored(client, tid)
    assert [(r["role"], r["content"]) for r in rows] == [
        ("user", "2 + 3?"),
        ("assistant", None),
        ("tool", "5"),
        ("assistant", "It is 5."),
    ]
    assert rows[1]["reasoning_content"] == "2 plus 3"
    (_, first, _), (_, _, replay) = wire.requests
    assert first.headers["x-api-key"] == "sk-thread-secret" and first.url.path == "/v1/messages"
    assert replay["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "2 plus 3", "signature": "sig-1"},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
        ],
    }
    assert replay["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}


async def test_tool_calls_written_as_text_are_recovered_for_flagged_models(app_factory: Any) -> None:
    printed = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    model = define_model(name="local", provider="test", text_tool_calls=True, script=[printed, "It is 5."])
    app = await app_factory(catalog(model, use="local"), with_worker=True)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await turn(client, tid, "2 + 3?")
    rows = await stored(client, tid)
    assert [(r["role"], r["content"]) for r in rows] == [
        ("user", "2 + 3?"),
        ("assistant", "Let me add."),
        ("tool", "5"),
        ("assistant", "It is 5."),
    ]
    (call,) = rows[1]["tool_calls"]
    assert call["id"].startswith("recovered_") and call["function"]["name"] == "add"
    assert rows[2]["tool_call_id"] == call["id"]


async def test_a_groq_refused_tool_call_is_recovered_from_its_failed_generation(app_factory: Any) -> None:
    refused = httpx.Response(
        400,
        json={
            "error": {
                "message": "Failed to call a function. Please adjust your prompt.",
                "code": "tool_use_failed",
                "failed_generation": '<function=add>{"a": 1, "b": 1}</function>',
            }
        },
    )
    wire = Wire(refused, ok(text_stream("Two.")))
    _, client, tid = await start(app_factory, catalog(), wire)
    await turn(client, tid, "1 + 1?")
    rows = await stored(client, tid)
    assert [(r["role"], r["content"]) for r in rows][2:] == [("tool", "2"), ("assistant", "Two.")]
    assert len(wire.requests) == 2


async def test_a_streaming_message_shows_its_partial_text_to_a_client_that_reconnects(app_factory: Any) -> None:
    """A streaming message's partial text reaches its row with the first delta `FLUSH_SECONDS` after its last write:
    twice here, the second over the first; the model's stream goes on once the test has read each."""
    read = [asyncio.Event(), asyncio.Event()]

    def piece(text: str) -> bytes:
        return f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]})}\n\n".encode()

    async def slowly() -> AsyncIterator[bytes]:
        yield piece("Hel")
        await asyncio.sleep(FLUSH_SECONDS + 0.05)
        yield piece("lo, ")  # flushed: "Hello, "
        await read[0].wait()
        await asyncio.sleep(FLUSH_SECONDS + 0.1)  # after the first write (its time is taken once it committed)
        yield piece("wor")  # flushed: "Hello, wor"
        await read[1].wait()
        yield text_stream("ld")

    wire = Wire(lambda _: httpx.Response(200, content=slowly()))
    _, client, tid = await start(app_factory, catalog(), wire)
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})

    def partial(text: str) -> Callable[[], Awaitable[dict[str, Any] | None]]:
        async def shown() -> dict[str, Any] | None:
            rows = [r for r in await stored(client, tid) if r["role"] == "assistant"]
            return rows[0] if rows and rows[0]["content"] == text else None

        return shown

    await wait_for(partial("Hello, "), timeout=5, interval=0.02)
    read[0].set()
    pending = await wait_for(partial("Hello, wor"), timeout=5, interval=0.02)
    assert pending["status"] == "pending"
    one = (await client.get(f"/threads/{tid}/messages/{pending['id']}")).json()
    assert (one["content"], one["status"]) == ("Hello, wor", "pending")
    read[1].set()
    await settle(client, tid)
    assert (await stored(client, tid))[-1]["content"] == "Hello, world"
    partial_events = [
        d for e, d in await event_types(client, tid) if e == "message_data" and d["data"]["role"] == "assistant"
    ]
    assert [d["data"]["status"] for d in partial_events] == ["pending", "completed"]  # flushing emits nothing
