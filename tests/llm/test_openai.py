"""The `openai` adapter at the wire level, against `httpx.MockTransport`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from app import llm
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
from app.llm.openai import OpenAIModel
from app.spec import define_model
from app.spec.messages import LLMImage, LLMMessage

KEY = "sk-test-0123456789abcdef"
Handler = Callable[[httpx.Request], httpx.Response]
SIMPLE = LLMRequest(model="gpt-4.1-mini", messages=[LLMMessage("user", "hi")])


class Reads(httpx.AsyncByteStream):
    """A response body arriving in these network reads."""

    def __init__(self, reads: list[bytes], then: asyncio.Event | None = None) -> None:
        self._reads = reads
        self._then = then  # what the body waits for after its reads, if anything
        self.ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read
        if self._then is not None:
            await self._then.wait()
        self.ended = True


def streamed(reads: list[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Reads(reads))


def sse(*events: dict[str, Any] | str) -> httpx.Response:
    """A streamed answer, an event per read (a model slower than the network): each a JSON chunk or raw data."""
    return streamed([f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events])


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice], **extra}


def usage_chunk(**usage: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}


STOP: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": "ok"}), chunk(finish="stop"), "[DONE]"]


async def call(
    handler: Handler, request: LLMRequest = SIMPLE, key: str | None = KEY, **fields: Any
) -> tuple[list[StreamEvent], LLMResponse]:
    """Stream `request` through an adapter whose server is `handler`; the deltas and the final response."""
    definition = define_model(**{"name": "gpt", "provider": "openai", "model": "gpt-4.1-mini", **fields})
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        model = llm.build(definition, http)
        assert isinstance(model, OpenAIModel)
        events = [e async for e in model.stream(request, CallContext("t", 0, api_key=key))]
    assert isinstance(events[-1], Done)
    assert not any(isinstance(e, Done) for e in events[:-1])
    return events[:-1], events[-1].response


def recording(response: Callable[[], httpx.Response]) -> tuple[list[httpx.Request], Handler]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return response()

    return seen, handler


async def sent_body(request: LLMRequest, **fields: Any) -> dict[str, Any]:
    seen, handler = recording(lambda: sse(*STOP))
    await call(handler, request, **fields)
    body: dict[str, Any] = json.loads(seen[0].content)
    return body


async def failure(handler: Handler, key: str | None = KEY, **fields: Any) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await call(handler, key=key, **fields)
    assert KEY not in str(caught.value) and KEY not in caught.value.message
    return caught.value


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CALLS: list[Any] = [
    {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
    {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
]
DETAILS = [{"type": "reasoning.text", "text": "Two cities.", "signature": "sig==", "format": "anthropic-claude-v1"}]
CONVERSATION = LLMRequest(
    model="gpt-4.1-mini",
    messages=[
        LLMMessage("system", "You are terse."),
        LLMMessage(
            "user",
            "Weather here and there?",
            images=[LLMImage("image/png", data="iVBORw0KGgo="), LLMImage("image/jpeg", url="https://x.test/a.jpg")],
        ),
        LLMMessage("assistant", None, tool_calls=CALLS, reasoning="Two cities.", reasoning_details=DETAILS),
        LLMMessage("tool", "sunny", tool_call_id="call_a", name="get_weather"),
        LLMMessage("tool", "rainy", tool_call_id="call_b", name="get_weather"),
        LLMMessage("assistant", "Paris sunny, Rome rainy.", reasoning="Summarise."),
        LLMMessage("user", "And Oslo?"),
        LLMMessage("assistant", "Checking.", tool_calls=[CALLS[0]], reasoning="One more city."),
        LLMMessage("tool", "snowy", tool_call_id="call_a", name="get_weather"),
    ],
    tools=[LLMTool("get_weather", "The weather in a city.", WEATHER)],
    tool_choice="required",
    parallel_tool_calls=False,
    reasoning={"effort": "high", "exclude": False},
    provider_options={"temperature": 0.2, "seed": 7, "reasoning_effort": "low"},
    max_tokens=1000,
)


async def test_request_body_for_a_representative_conversation() -> None:
    seen, handler = recording(lambda: sse(*STOP))
    await call(handler, CONVERSATION)
    [request] = seen
    assert request.method == "POST"
    assert str(request.url) == "https://api.openai.com/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {
        "model": "gpt-4.1-mini",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather here and there?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                ],
            },
            # reasoning_details replayed exactly; they stand for the reasoning text, which is not sent twice
            {"role": "assistant", "content": None, "tool_calls": CALLS, "reasoning_details": DETAILS},
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "rainy"},
            # reasoning of a turn without tool calls is not replayed
            {"role": "assistant", "content": "Paris sunny, Rome rainy."},
            {"role": "user", "content": "And Oslo?"},
            # reasoning text of a tool-calling turn is replayed as DeepSeek requires
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [CALLS[0]],
                "reasoning_content": "One more city.",
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "snowy"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER},
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_completion_tokens": 1000,
        "temperature": 0.2,
        "seed": 7,
        "reasoning_effort": "low",  # provider_options win
    }


async def test_tool_settings_only_when_set_and_with_tools() -> None:
    tools = [LLMTool("get_weather", "The weather.", WEATHER)]
    unset = await sent_body(LLMRequest(model="m", messages=[LLMMessage("user", "hi")], tools=tools))
    assert "tool_choice" not in unset and "parallel_tool_calls" not in unset and len(unset["tools"]) == 1
    parallel = await sent_body(LLMRequest(model="m", messages=[], tools=tools, parallel_tool_calls=True))
    assert parallel["parallel_tool_calls"] is True
    for o_series in ("o1", "o3-mini", "o4-mini-2025-04-16", "openai/o3"):  # they refuse the parameter, even false
        body = await sent_body(LLMRequest(model=o_series, messages=[], tools=tools, parallel_tool_calls=False))
        assert "parallel_tool_calls" not in body and len(body["tools"]) == 1, o_series
    assert (await sent_body(LLMRequest(model="gpt-4o", messages=[], tools=tools, parallel_tool_calls=False)))[
        "parallel_tool_calls"
    ] is False
    # OpenAI refuses tool_choice and parallel_tool_calls without tools
    toolless = await sent_body(LLMRequest(model="m", messages=[], tool_choice="auto", parallel_tool_calls=False))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & toolless.keys()
    assert not {"max_tokens", "max_completion_tokens", "reasoning", "reasoning_effort"} & toolless.keys()


@pytest.mark.parametrize(
    ("base_url", "url", "expected"),
    [
        (None, "https://api.openai.com/v1/chat/completions", {"max_completion_tokens": 500, "reasoning_effort": "low"}),
        (
            "https://openrouter.ai/api/v1/",
            "https://openrouter.ai/api/v1/chat/completions",
            {"max_tokens": 500, "reasoning": {"effort": "low", "max_tokens": 2000, "exclude": True}},
        ),
        (
            "http://localhost:11434/v1",
            "http://localhost:11434/v1/chat/completions",
            {"max_tokens": 500, "reasoning_effort": "low"},
        ),
        (
            "https://api.deepseek.com///",
            "https://api.deepseek.com/chat/completions",
            {"max_tokens": 500, "reasoning_effort": "low"},
        ),
    ],
)
async def test_base_url_max_tokens_and_reasoning_by_server(
    base_url: str | None, url: str, expected: dict[str, Any]
) -> None:
    seen, handler = recording(lambda: sse(*STOP))
    reasoning = {"effort": "low", "max_tokens": 2000, "exclude": True}
    request = LLMRequest(model="m", messages=[LLMMessage("user", "hi")], max_tokens=500, reasoning=reasoning)
    await call(handler, request, base_url=base_url)
    assert str(seen[0].url) == url
    body = json.loads(seen[0].content)
    keys = {"max_tokens", "max_completion_tokens", "reasoning", "reasoning_effort"}
    assert {k: v for k, v in body.items() if k in keys} == expected


@pytest.mark.parametrize(
    ("config", "sent"),
    [
        ({"include": True, "exclude": False}, {"enabled": True}),
        ({"include": False, "exclude": False}, {"exclude": True}),
        ({"exclude": False}, None),
    ],
)
async def test_openrouter_reasoning_switches(config: dict[str, Any], sent: dict[str, Any] | None) -> None:
    request = LLMRequest(model="m", messages=[], reasoning=config)
    body = await sent_body(request, base_url="https://openrouter.ai/api/v1")
    assert body.get("reasoning") == sent


async def test_no_authorization_header_without_a_key() -> None:
    seen, handler = recording(lambda: sse(*STOP))
    await call(handler, key=None, base_url="http://localhost:1234/v1")
    assert "authorization" not in seen[0].headers
    await call(handler, key="", base_url="http://localhost:1234/v1")
    assert "authorization" not in seen[1].headers


async def test_streamed_text_reasoning_and_interleaved_tool_calls() -> None:
    def tool(index: int, arguments: str, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
        function = {"arguments": arguments} | ({"name": name} if name else {})
        return {"index": index, "function": function} | ({"id": call_id, "type": "function"} if call_id else {})

    stream = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Need "}),
        chunk({"reasoning_content": "both."}),
        chunk({"content": "Let me "}),
        chunk({"content": "check."}),
        chunk({"tool_calls": [tool(0, "", "call_p", "get_weather")]}),
        chunk({"tool_calls": [tool(1, "", "call_r", "get_weather")]}),
        chunk({"tool_calls": [tool(0, '{"ci')]}),
        chunk({"tool_calls": [tool(1, '{"city":')]}),
        chunk({"tool_calls": [tool(0, 'ty":"Paris"}')]}),
        chunk({"tool_calls": [tool(1, '"Rome"}')]}),
        chunk(finish="tool_calls"),
        usage_chunk(
            prompt_tokens=120,
            completion_tokens=45,
            total_tokens=165,
            prompt_tokens_details={"cached_tokens": 100, "audio_tokens": 0},
            completion_tokens_details={"reasoning_tokens": 30, "audio_tokens": 0},
        ),
        "[DONE]",
    )
    deltas, response = await call(lambda _: stream)
    assert deltas == [ReasoningDelta("Need "), ReasoningDelta("both."), TextDelta("Let me "), TextDelta("check.")]
    assert response.text == "Let me check."
    assert response.reasoning == "Need both."
    assert response.reasoning_details is None
    assert response.finish_reason == "tool_calls"
    assert response.tool_calls == [
        {"id": "call_p", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_r", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
    ]
    assert response.usage.as_dict() == {
        "input_tokens": 120,
        "output_tokens": 45,
        "cached_tokens": 100,
        "reasoning_tokens": 30,
    }


async def test_openrouter_reasoning_details_keepalives_and_index_less_calls() -> None:
    text = ": OPENROUTER PROCESSING\n\n" + "".join(
        f"data: {json.dumps(c)}\n\n"
        for c in [
            chunk(
                {"reasoning": "Think", "reasoning_details": [{"type": "reasoning.text", "text": "Think", "index": 0}]}
            ),
            chunk({"reasoning": "ing.", "reasoning_details": [{"type": "reasoning.text", "text": "ing.", "index": 0}]}),
            chunk({"reasoning_details": [{"type": "reasoning.text", "text": "", "signature": "sig", "index": 0}]}),
            chunk({"reasoning_details": [{"type": "reasoning.encrypted", "data": "abc", "index": 1}]}),
            # a server that sends whole calls without `index` and without ids
            chunk({"tool_calls": [{"function": {"name": "a", "arguments": "{}"}}, {"function": {"name": "b"}}]}),
            chunk(finish="stop"),
            usage_chunk(prompt_tokens=10, completion_tokens=5, prompt_cache_hit_tokens=8),
        ]
    )
    stream = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=text.encode())
    deltas, response = await call(lambda _: stream, base_url="https://openrouter.ai/api/v1")
    assert deltas == [ReasoningDelta("Thinking.")]  # one read: its deltas go out as one
    assert response.reasoning == "Thinking."
    assert response.reasoning_details == [
        {"type": "reasoning.text", "text": "Thinking.", "signature": "sig", "index": 0},
        {"type": "reasoning.encrypted", "data": "abc", "index": 1},
    ]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in response.tool_calls] == [
        ("a", "{}"),
        ("b", "{}"),
    ]
    assert all(c["id"].startswith("call_") for c in response.tool_calls)
    assert response.tool_calls[0]["id"] != response.tool_calls[1]["id"]
    assert response.finish_reason == "tool_calls"  # `stop` with calls, as some local servers say
    assert (response.usage.input_tokens, response.usage.cached_tokens) == (10, 8)  # no stream end marker needed


async def test_the_stream_is_framed_from_its_reads_whatever_their_boundaries() -> None:
    """Events are read a network read at a time: the deltas of one read go out as one, an event or a UTF-8
    character split between reads is joined, and `\\r\\n` (even split), `\\r`, comments and multi-line `data` are
    read as the SSE format says."""

    def data(delta: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps(chunk(delta, finish)).encode()

    reads = [
        data({"content": "Hel"}) + b"\r\n\r\n" + data({"content": "lo"}) + b"\r\n\r\n",  # one read: one delta
        b": keep-alive\r",  # a comment, its `\r\n` split between reads
        b"\n\r\n",
        b'data: {"choices": [{"index": 0, "delta":\ndata: {"content": " caf\xc3',  # two data lines; a split "é"
        b'\xa9 \xe2\x98\x95"}}]}\n\n',
        data({"reasoning_content": "hm"}) + b"\r\r",  # bare `\r` line ends
        data(finish="stop") + b"\n\ndata: [DONE]",  # the last event without its blank line
    ]
    deltas, response = await call(lambda _: streamed(reads))
    assert deltas == [TextDelta("Hello"), TextDelta(" caf\u00e9 \u2615"), ReasoningDelta("hm")]
    assert (response.text, response.reasoning, response.finish_reason) == ("Hello caf\u00e9 \u2615", "hm", "stop")


async def test_the_body_after_done_is_read_to_its_end_so_the_connection_is_kept() -> None:
    """httpx pools a connection only once its response was read to the end: a stream left at `[DONE]` (the body's
    closing chunk unread) dropped it, and every call opened a new one (a TCP and a TLS handshake each)."""
    body = Reads([f"data: {json.dumps(e) if isinstance(e, dict) else e}\n\n".encode() for e in STOP] + [b"\n"])
    await call(lambda _: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    assert body.ended


async def test_a_server_that_keeps_the_stream_open_after_done_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.llm.sse.REST_SECONDS", 0.05)
    body = Reads([f"data: {json.dumps(e) if isinstance(e, dict) else e}\n\n".encode() for e in STOP], asyncio.Event())
    deltas, response = await asyncio.wait_for(
        call(lambda _: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)), 5
    )
    assert (deltas, response.text, body.ended) == ([TextDelta("ok")], "ok", False)


@pytest.mark.parametrize(
    ("wire", "mapped"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "content_filter"),
        ("function_call", "tool_calls"),
        ("eos", "eos"),
    ],
)
async def test_finish_reasons(wire: str, mapped: str) -> None:
    _, response = await call(lambda _: sse(chunk({"content": "x"}), chunk(finish=wire), "[DONE]"))
    assert response.finish_reason == mapped
    assert response.usage.as_dict() == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
    }


async def test_a_server_that_does_not_stream() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        message = {"role": "assistant", "content": "whole", "tool_calls": [CALLS[1]]}
        usage = {"prompt_tokens": 3, "completion_tokens": 2}
        return httpx.Response(
            200, json={"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": usage}
        )

    deltas, response = await call(handler, capabilities={"supports_streaming": False})
    body = json.loads(seen[0].content)
    assert body["stream"] is False and "stream_options" not in body
    assert deltas == [TextDelta("whole")]
    assert response.tool_calls == [CALLS[1]] and response.usage.output_tokens == 2


# --- errors ---


async def test_bad_request_surfaces_the_providers_message() -> None:
    body = {"error": {"message": "Invalid schema for function 'x'.", "type": "invalid_request_error", "code": None}}
    error = await failure(lambda _: httpx.Response(400, json=body))
    assert (error.kind, error.status, error.retriable) == ("bad_request", 400, False)
    assert "Invalid schema for function 'x'." in error.message
    not_found = await failure(lambda _: httpx.Response(404, text="404 page not found"))
    assert not_found.kind == "bad_request" and "404 page not found" in not_found.message


async def test_openrouter_error_metadata_and_echoed_keys_are_handled() -> None:
    body = {"error": {"message": "Provider returned error", "code": 400, "metadata": {"raw": f"bad key {KEY}?"}}}
    error = await failure(lambda _: httpx.Response(400, json=body))
    assert "Provider returned error" in error.message and "bad key ***?" in error.message


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_name_the_variable_never_the_key(status: int) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error"}}
    error = await failure(lambda _: httpx.Response(status, json=body), api_key_env="OPENROUTER_API_KEY")
    assert (error.kind, error.status, error.retriable) == ("auth", status, False)
    assert "OPENROUTER_API_KEY" in error.message
    default = await failure(lambda _: httpx.Response(status, json=body), key=None)
    assert "OPENAI_API_KEY" in default.message and "not set" in default.message


async def test_a_key_no_header_can_carry_is_refused_unsent() -> None:
    seen, handler = recording(lambda: sse(*STOP))
    with pytest.raises(ProviderError) as caught:
        await call(handler, key="sk-abc\ndef")
    assert caught.value.kind == "auth" and "OPENAI_API_KEY" in caught.value.message
    assert "sk-abc" not in caught.value.message and not seen
    await call(handler, key=f" {KEY}\n")  # surrounding whitespace from an env file is dropped
    assert seen[0].headers["authorization"] == f"Bearer {KEY}"


async def test_rate_limit_with_retry_after_seconds_date_and_ms() -> None:
    error = await failure(
        lambda _: httpx.Response(429, headers={"Retry-After": "7"}, json={"error": {"message": "slow"}})
    )
    assert (error.kind, error.status, error.retriable, error.retry_after) == ("rate_limited", 429, True, 7.0)
    assert "slow" in error.message
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    dated = await failure(lambda _: httpx.Response(429, headers={"Retry-After": when}))
    assert dated.retry_after is not None and 25 <= dated.retry_after <= 30
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    assert (await failure(lambda _: httpx.Response(429, headers={"Retry-After": past}))).retry_after == 0
    precise = await failure(lambda _: httpx.Response(429, headers={"retry-after-ms": "1500", "Retry-After": "2"}))
    assert precise.retry_after == 1.5
    bare = await failure(lambda _: httpx.Response(429, headers={"Retry-After": "soon"}))
    assert bare.retry_after is None and bare.retriable


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_retriable(status: int) -> None:
    error = await failure(lambda _: httpx.Response(status, json={"error": {"message": "Overloaded"}}))
    assert (error.kind, error.status, error.retriable) == ("server", status, True)
    assert "Overloaded" in error.message


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ReadTimeout("read timed out"), "timeout"),
        (httpx.ConnectTimeout("connect timed out"), "timeout"),
        (httpx.ConnectError("[Errno 111] Connection refused"), "connection"),
        (httpx.RemoteProtocolError("peer closed connection"), "connection"),
    ],
)
async def test_transport_failures_are_retriable(exc: httpx.HTTPError, kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    error = await failure(handler)
    assert (error.kind, error.status, error.retriable) == (kind, None, True)
    assert "api.openai.com" in error.message


@pytest.mark.parametrize(
    "events",
    [
        [chunk({"content": "half an ans"})],  # cut off, no finish_reason
        [chunk({"content": "half"}), "[DONE]"],  # ended without saying why
        [chunk({"content": "x"}), "{not json", chunk(finish="stop")],
        [["a list"]],
    ],
)
async def test_truncated_or_malformed_streams(events: list[Any]) -> None:
    stream = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events).encode()
    error = await failure(lambda _: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream))
    assert (error.kind, error.retriable) == ("stream", True)


@pytest.mark.parametrize(
    ("error", "kind", "retriable"),
    [
        ({"message": "Upstream overloaded", "code": 502}, "server", True),
        ({"message": "Rate limited upstream", "code": 429}, "rate_limited", True),
        ({"message": "The server had an error", "type": "server_error"}, "server", True),
        ({"message": "Context too long", "type": "invalid_request_error"}, "bad_request", False),
        ("plain text error", "server", True),
    ],
)
async def test_errors_inside_the_stream(error: Any, kind: str, retriable: bool) -> None:
    stream = sse(chunk({"content": "par"}), {"error": error}, "[DONE]")
    caught = await failure(lambda _: stream)
    assert (caught.kind, caught.retriable) == (kind, retriable)
    assert "mid-stream" in caught.message


async def test_finish_reason_error_is_a_server_error() -> None:
    caught = await failure(lambda _: sse(chunk({"content": "par"}), chunk(finish="error"), "[DONE]"))
    assert (caught.kind, caught.retriable) == ("server", True)


async def test_no_key_for_a_hosted_api_fails_before_any_request() -> None:
    """OpenAI and OpenRouter need a key: without one, name the variable instead of reaching the network (offline,
    that was a DNS error); a server of one's own (a `base_url`) may take none."""
    seen, handler = recording(lambda: sse(*STOP))
    for base_url in (None, "https://openrouter.ai/api/v1"):
        error = await failure(handler, key=None, base_url=base_url)
        assert (error.kind, error.message) == ("auth", "openai: no API key: `OPENAI_API_KEY` is not set")
    assert seen == []
    await call(handler, key=None, base_url="http://127.0.0.1:11434/v1")
    assert [r.url.host for r in seen] == ["127.0.0.1"] and "authorization" not in seen[0].headers
