"""The `anthropic` provider at the wire level: the request it sends and the streams it reads, over MockTransport."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app import llm
from app.llm.anthropic import AnthropicModel
from app.llm.base import (
    CallContext,
    Done,
    LLMRequest,
    LLMResponse,
    LLMTool,
    ProviderError,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
)
from app.spec import define_model
from app.spec.definitions import ModelDefinition
from app.spec.messages import LLMImage, LLMMessage

KEY = "sk-ant-secret-key-123"
CTX = CallContext("thread", 0, api_key=KEY)
HELLO = LLMRequest(model="claude-x", messages=[LLMMessage("system", "sys"), LLMMessage("user", "hi")])
WEATHER = LLMTool(
    "get_weather", "The weather in a city.", {"type": "object", "properties": {"city": {"type": "string"}}}
)
THINKING = {"type": "thinking", "thinking": "Earlier thought.", "signature": "sig-old"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}
Handler = Callable[[httpx.Request], httpx.Response]


def sse(*events: dict[str, Any]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def start(input_tokens: int = 10, **usage: int) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "stop_reason": None,
    }
    return {"type": "message_start", "message": {**message, "usage": {"input_tokens": input_tokens, **usage}}}


def text_block(index: int, *parts: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
        *({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}} for p in parts),
        {"type": "content_block_stop", "index": index},
    ]


def end(stop_reason: str = "end_turn", output_tokens: int = 5) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]


def model(handler: Handler, **fields: Any) -> tuple[AnthropicModel, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    definition: ModelDefinition = define_model(name="claude", provider="anthropic", model="claude-x", **fields)
    built = llm.build(definition, http)
    assert isinstance(built, AnthropicModel)
    return built, http


async def run(handler: Handler, request: LLMRequest = HELLO, **fields: Any) -> tuple[list[StreamEvent], LLMResponse]:
    m, http = model(handler, **fields)
    async with http:
        events = [e async for e in m.stream(request, CTX)]
    assert isinstance(events[-1], Done)
    return events[:-1], events[-1].response


def replying(*events: dict[str, Any], seen: list[httpx.Request] | None = None, one_read: bool = False) -> Handler:
    """A server streaming `events`, each in a network read of its own (a model slower than the network), or all in
    `one_read`."""

    async def reads() -> AsyncIterator[bytes]:
        for event in [events] if one_read else [(e,) for e in events]:
            yield sse(*event)

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(200, content=reads(), headers={"content-type": "text/event-stream"})

    return handler


async def sent_body(request: LLMRequest, **fields: Any) -> dict[str, Any]:
    seen: list[httpx.Request] = []
    await run(replying(start(), *text_block(0, "ok"), *end(), seen=seen), request, **fields)
    [wire] = seen
    body: dict[str, Any] = json.loads(wire.content)
    return body


async def failure(handler: Handler, request: LLMRequest = HELLO, **fields: Any) -> ProviderError:
    m, http = model(handler, **fields)
    async with http:
        with pytest.raises(ProviderError) as info:
            _ = [e async for e in m.stream(request, CTX)]
    return info.value


# -- the request ------------------------------------------------------------------------------------------------


async def test_request_url_headers_and_simple_body() -> None:
    seen: list[httpx.Request] = []
    await run(replying(start(), *text_block(0, "ok"), *end(), seen=seen), HELLO)
    [wire] = seen
    assert wire.method == "POST" and str(wire.url) == "https://api.anthropic.com/v1/messages"
    assert wire.headers["x-api-key"] == KEY and wire.headers["anthropic-version"] == "2023-06-01"
    assert wire.headers["content-type"] == "application/json"
    assert json.loads(wire.content) == {
        "model": "claude-x",
        "max_tokens": 8192,
        "stream": True,
        "system": "sys",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


async def test_base_url_is_the_bare_origin() -> None:
    seen: list[httpx.Request] = []
    await run(replying(start(), *end(), seen=seen), HELLO, base_url="http://proxy.local:8080/")
    assert str(seen[0].url) == "http://proxy.local:8080/v1/messages"


async def test_full_conversation_body() -> None:
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    broken = {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}
    request = LLMRequest(
        model="claude-x",
        messages=[
            LLMMessage("system", "You are helpful."),
            LLMMessage("user", "What is in this picture?", images=[LLMImage("image/png", data="iVBOR")]),
            LLMMessage("user", "And this one?", images=[LLMImage("image/jpeg", url="https://example.com/a.jpg")]),
            LLMMessage(
                "assistant",
                "Let me check the weather.",
                tool_calls=[call, broken],  # type: ignore[list-item]
                reasoning="Earlier thought.",
                reasoning_details=[THINKING, REDACTED, {"type": "reasoning.text", "text": "another provider's"}],
            ),
            LLMMessage("tool", "18°C and sunny", tool_call_id="toolu_1", name="get_weather"),
            LLMMessage("tool", "", tool_call_id="toolu_2", name="get_weather"),
            LLMMessage("user", "Thanks!"),
            LLMMessage("system", "Registry: no subagents."),
        ],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        reasoning={"effort": "low", "exclude": False},
        provider_options={"temperature": 1, "metadata": {"user_id": "u1"}},
    )
    assert await sent_body(request) == {
        "model": "claude-x",
        "max_tokens": 8192 + 2048,
        "stream": True,
        "system": "You are helpful.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
                    {"type": "text", "text": "And this one?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    THINKING,
                    REDACTED,
                    {"type": "text", "text": "Let me check the weather."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18°C and sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2"},
                    {"type": "text", "text": "Thanks!"},
                    {"type": "text", "text": "[system] Registry: no subagents."},
                ],
            },
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "The weather in a city.",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "temperature": 1,
        "metadata": {"user_id": "u1"},
    }


async def test_tool_results_lead_a_merged_user_turn_and_empty_messages_are_dropped() -> None:
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    request = LLMRequest(
        model="claude-x",
        messages=[
            LLMMessage("system", ""),
            LLMMessage("user", "go"),
            LLMMessage("assistant", None, tool_calls=[call]),  # type: ignore[list-item]
            LLMMessage("system", "A message arrived while the tool ran."),
            LLMMessage("tool", "done", tool_call_id="toolu_1"),
            LLMMessage("assistant", None),
            LLMMessage("assistant", "Done."),
        ],
    )
    body = await sent_body(request)
    assert "system" not in body  # the prompt was empty; the later system message is still user text
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"},
                {"type": "text", "text": "[system] A message arrived while the tool ran."},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
    ]


@pytest.mark.parametrize(
    ("tool_choice", "parallel", "expected"),
    [
        (None, None, None),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("auto", None, {"type": "auto"}),
        ("auto", True, {"type": "auto"}),
        ("none", False, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ("get_weather", False, {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}),
    ],
)
async def test_tool_choice(tool_choice: str | None, parallel: bool | None, expected: dict[str, Any] | None) -> None:
    request = LLMRequest(
        model="claude-x",
        messages=HELLO.messages,
        tools=[WEATHER],
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
    )
    assert (await sent_body(request)).get("tool_choice") == expected


async def test_no_tools_sends_neither_tools_nor_tool_choice() -> None:
    request = LLMRequest(model="claude-x", messages=HELLO.messages, tool_choice="required", parallel_tool_calls=False)
    body = await sent_body(request)
    assert "tools" not in body and "tool_choice" not in body


@pytest.mark.parametrize(
    ("reasoning", "cap", "budget", "max_tokens"),
    [
        (None, None, None, 8192),
        ({"exclude": False}, None, 8192, 8192 + 8192),  # `reasoning` set without effort: medium
        ({"effort": "minimal", "exclude": False}, None, 1024, 8192 + 1024),
        ({"effort": "high", "exclude": False}, None, 16384, 8192 + 16384),
        ({"max_tokens": 3000, "effort": "high", "exclude": False}, None, 3000, 8192 + 3000),
        ({"max_tokens": 10, "exclude": False}, None, 1024, 8192 + 1024),  # the API's floor
        ({"effort": "high", "exclude": False}, 32000, 16384, 32000),
        ({"effort": "high", "exclude": False}, 10000, 5000, 10000),  # the cap wins, the answer keeps half
        ({"enabled": False}, 4096, None, 4096),
    ],
)
async def test_thinking_budget_and_max_tokens(
    reasoning: dict[str, Any] | None, cap: int | None, budget: int | None, max_tokens: int
) -> None:
    request = LLMRequest(model="claude-x", messages=HELLO.messages, reasoning=reasoning)
    body = await sent_body(request, capabilities={"max_output_tokens": cap})
    assert body["max_tokens"] == max_tokens
    assert body.get("thinking") == (None if budget is None else {"type": "enabled", "budget_tokens": budget})


async def test_request_max_tokens_beats_the_model_capability() -> None:
    request = LLMRequest(model="claude-x", messages=HELLO.messages, max_tokens=1500)
    assert (await sent_body(request, capabilities={"max_output_tokens": 4096}))["max_tokens"] == 1500


# -- the stream -------------------------------------------------------------------------------------------------


async def test_streamed_text() -> None:
    events, response = await run(replying(start(), {"type": "ping"}, *text_block(0, "Hel", "lo", "!"), *end()))
    assert events == [TextDelta("Hel"), TextDelta("lo"), TextDelta("!")]
    assert response.text == "Hello!" and response.finish_reason == "stop"
    assert response.tool_calls == [] and response.reasoning is None and response.reasoning_details is None


async def test_the_deltas_of_one_read_go_out_as_one() -> None:
    """A read carrying several events (a fast model, a busy connection) hands on one delta per kind in a row."""
    stream = replying(start(), *text_block(0, "Hel", "lo", "!"), *end(), one_read=True)
    events, response = await run(stream)
    assert events == [TextDelta("Hello!")]
    assert response.text == "Hello!"


async def test_the_body_after_message_stop_is_read_to_its_end_so_the_connection_is_kept() -> None:
    """httpx pools a connection only once its response was read to the end (see the `openai` adapter's test)."""
    ended: list[bool] = []

    async def reads() -> AsyncIterator[bytes]:
        yield sse(start(), *text_block(0, "Hi"), *end())
        yield b"\n"  # what follows `message_stop`: here a blank line, usually just the body's end
        ended.append(True)

    await run(lambda _: httpx.Response(200, content=reads(), headers={"content-type": "text/event-stream"}))
    assert ended == [True]


async def test_thinking_and_tool_use_become_the_final_response() -> None:
    stream = [
        start(input_tokens=50, cache_read_input_tokens=1000, cache_creation_input_tokens=200, output_tokens=1),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Need the "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "weather."}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig-1"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "enc"}},
        {"type": "content_block_stop", "index": 1},
        *text_block(2, "Checking."),
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {}},
        },
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": '{"city"'}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": ': "Oslo"}'}},
        {"type": "content_block_stop", "index": 3},
        {
            "type": "content_block_start",
            "index": 4,
            "content_block": {"type": "tool_use", "id": "toolu_10", "name": "now", "input": {}},
        },
        {"type": "content_block_stop", "index": 4},
        *end("tool_use", output_tokens=77),
    ]
    reasoning = {"effort": "low", "exclude": False}
    request = LLMRequest(model="claude-x", messages=HELLO.messages, reasoning=reasoning)
    events, response = await run(replying(*stream), request)
    assert events == [ReasoningDelta("Need the "), ReasoningDelta("weather."), TextDelta("Checking.")]
    assert response.text == "Checking."
    assert response.reasoning == "Need the weather."
    assert response.reasoning_details == [
        {"type": "thinking", "thinking": "Need the weather.", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "enc"},
    ]
    assert response.tool_calls == [
        {"id": "toolu_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "toolu_10", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    assert response.finish_reason == "tool_calls"
    assert response.usage.as_dict() == {
        "input_tokens": 1250,
        "output_tokens": 77,
        "cached_tokens": 1000,
        "reasoning_tokens": 0,
    }


async def test_a_response_replays_as_the_next_request_would_send_it() -> None:
    stream = [
        start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm."}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig-2"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}},
        },
        {"type": "content_block_stop", "index": 1},
        *end("tool_use"),
    ]
    _, first = await run(replying(*stream))
    replay = LLMMessage("assistant", first.text or None, first.tool_calls, reasoning_details=first.reasoning_details)
    request = LLMRequest(
        model="claude-x", messages=[*HELLO.messages, replay, LLMMessage("tool", "12:00", tool_call_id="toolu_1")]
    )
    assert (await sent_body(request))["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Hmm.", "signature": "sig-2"},
                {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"}]},
    ]


async def test_excluded_reasoning_is_not_streamed_but_kept_for_replay() -> None:
    stream = [
        start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "secret"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
        {"type": "content_block_stop", "index": 0},
        *text_block(1, "Answer."),
        *end(),
    ]
    request = LLMRequest(model="claude-x", messages=HELLO.messages, reasoning={"exclude": True})
    events, response = await run(replying(*stream), request)
    assert events == [TextDelta("Answer.")]
    assert response.reasoning is None
    assert response.reasoning_details == [{"type": "thinking", "thinking": "secret", "signature": "s"}]


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "pause_turn"),
    ],
)
async def test_stop_reasons(stop_reason: str, finish_reason: str) -> None:
    _, response = await run(replying(start(), *text_block(0, "x"), *end(stop_reason)))
    assert response.finish_reason == finish_reason


async def test_usage_from_message_delta_replaces_message_start() -> None:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"input_tokens": 12, "cache_read_input_tokens": 30, "output_tokens": 9},
    }
    _, response = await run(replying(start(input_tokens=10, output_tokens=1), delta, {"type": "message_stop"}))
    assert (response.usage.input_tokens, response.usage.cached_tokens, response.usage.output_tokens) == (42, 30, 9)


# -- errors -----------------------------------------------------------------------------------------------------


def status(code: int, message: str = "boom", headers: dict[str, str] | None = None) -> Handler:
    error = {"type": "error", "error": {"type": "some_error", "message": message}}
    return lambda _: httpx.Response(code, json=error, headers=headers)


async def test_400_surfaces_the_api_message() -> None:
    error = await failure(status(400, "messages.1.content.0: unexpected `tool_use_id`"))
    assert (error.kind, error.status, error.retriable) == ("bad_request", 400, False)
    assert "messages.1.content.0: unexpected `tool_use_id`" in error.message


@pytest.mark.parametrize("code", [401, 403])
async def test_auth_errors_name_the_variable_never_the_key(code: int) -> None:
    error = await failure(status(code, f"invalid x-api-key {KEY}"), api_key_env="MY_CLAUDE_KEY")
    assert (error.kind, error.status, error.retriable) == ("auth", code, False)
    assert "MY_CLAUDE_KEY" in error.message and KEY not in error.message and KEY not in str(error)
    default = await failure(status(code, "invalid x-api-key"))
    assert "ANTHROPIC_API_KEY" in default.message


async def test_a_missing_key_is_an_auth_error_without_a_request() -> None:
    m, http = model(lambda _: pytest.fail("no request may be sent"))
    async with http:
        with pytest.raises(ProviderError) as info:
            _ = [e async for e in m.stream(HELLO, CallContext("thread", 0))]
    assert info.value.kind == "auth" and "ANTHROPIC_API_KEY" in info.value.message


async def test_429_is_retriable_with_retry_after_seconds() -> None:
    error = await failure(status(429, "rate limited", {"retry-after": "17"}))
    assert (error.kind, error.status, error.retriable, error.retry_after) == ("rate_limited", 429, True, 17.0)


async def test_429_retry_after_as_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    error = await failure(status(429, "rate limited", {"retry-after": when}))
    assert error.retry_after is not None and 28 <= error.retry_after <= 30
    assert (await failure(status(429, "rate limited"))).retry_after is None


@pytest.mark.parametrize("code", [500, 502, 529])
async def test_server_errors_are_retriable(code: int) -> None:
    error = await failure(status(code, "Overloaded"))
    assert (error.kind, error.status, error.retriable) == ("server", code, True)
    assert "Overloaded" in error.message


async def test_a_non_json_error_body_is_surfaced() -> None:
    error = await failure(lambda _: httpx.Response(502, text="<html>Bad gateway</html>"))
    assert error.kind == "server" and "Bad gateway" in error.message


async def test_overloaded_error_event_in_the_stream() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    error = await failure(replying(start(), *text_block(0, "partial"), overloaded))
    assert (error.kind, error.status, error.retriable) == ("server", 529, True)
    assert "Overloaded" in error.message


async def test_invalid_request_error_event_is_not_retriable() -> None:
    invalid = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    error = await failure(replying(start(), invalid))
    assert (error.kind, error.retriable) == ("bad_request", False)


async def test_timeout() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("read timed out", request=request)

    error = await failure(handler)
    assert (error.kind, error.retriable) == ("timeout", True)


async def test_connection_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    error = await failure(handler)
    assert (error.kind, error.retriable) == ("connection", True)


async def test_connection_dropped_mid_stream() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield sse(start(), *text_block(0, "partial"))
        raise httpx.RemoteProtocolError("peer closed connection")

    error = await failure(lambda _: httpx.Response(200, content=chunks()))
    assert (error.kind, error.retriable) == ("connection", True)


async def test_truncated_stream() -> None:
    m, http = model(replying(start(), *text_block(0, "Hel", "lo")))
    events: list[StreamEvent] = []

    async def consume() -> None:
        async for event in m.stream(HELLO, CTX):
            events.append(event)

    async with http:
        with pytest.raises(ProviderError) as info:
            await consume()
    assert events == [TextDelta("Hel"), TextDelta("lo")]  # the deltas went out before the stream broke
    assert (info.value.kind, info.value.retriable) == ("stream", True)


async def test_malformed_stream_events() -> None:
    garbage = await failure(lambda _: httpx.Response(200, content=b"data: {not json\n\n"))
    assert (garbage.kind, garbage.retriable) == ("stream", True)
    orphan = {"type": "content_block_delta", "index": 5, "delta": {"type": "text_delta", "text": "x"}}
    unknown_block = await failure(replying(start(), orphan))
    assert (unknown_block.kind, unknown_block.retriable) == ("stream", True)
