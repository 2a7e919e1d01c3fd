"""The `test` provider: script entries, `respond`, chunking, delay and errors."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from pydantic import ValidationError

from app.llm.base import CallContext, Done, LLMRequest, LLMResponse, ProviderError, ReasoningDelta, TextDelta
from app.llm.test import TestModel
from app.spec import define_model
from app.spec.messages import LLMMessage

REQUEST = LLMRequest(model="m", messages=[LLMMessage("system", "sys"), LLMMessage("user", "hello")])


async def collect(model: TestModel, index: int = 0) -> tuple[list[Any], LLMResponse]:
    events = [e async for e in model.stream(REQUEST, CallContext("t", index))]
    assert isinstance(events[-1], Done)
    return events[:-1], events[-1].response


async def test_script_entries_by_call_index() -> None:
    model = TestModel(
        define_model(
            name="m",
            provider="test",
            script=[
                "Hello!",
                {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
                {"text": "Thinking done.", "reasoning": "because", "usage": {"input_tokens": 7, "output_tokens": 3}},
            ],
        )
    )
    _, first = await collect(model, 0)
    assert first.text == "Hello!" and first.tool_calls == [] and first.finish_reason == "stop"
    _, second = await collect(model, 1)
    assert second.finish_reason == "tool_calls"
    [call] = second.tool_calls
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    deltas, third = await collect(model, 2)
    assert isinstance(deltas[0], ReasoningDelta) and deltas[0].text == "because"
    assert third.reasoning == "because"
    assert (third.usage.input_tokens, third.usage.output_tokens) == (7, 3)


async def test_tool_call_ids_are_unique_per_thread_without_a_request_count() -> None:
    """A `respond` model is called with no script position (the engine counts requests only for a script): its
    tool calls still get ids no other call of the thread has."""
    model = TestModel(define_model(name="m", provider="test", respond=lambda r: {"tool_calls": [{"name": "a"}] * 2}))
    ids = [call["id"] for _ in range(3) for call in (await collect(model, 0))[1].tool_calls]
    assert len(set(ids)) == 6
    scripted = TestModel(define_model(name="s", provider="test", script=[{"tool_calls": [{"name": "a"}]}] * 2))
    assert [(await collect(scripted, i))[1].tool_calls[0]["id"] for i in range(2)] == ["call_s_0_0", "call_s_1_0"]


async def test_script_exhausted_is_a_provider_error() -> None:
    model = TestModel(define_model(name="m", provider="test", script=["only"]))
    with pytest.raises(ProviderError, match="test script exhausted"):
        await collect(model, 1)


async def test_error_entries_raise_with_status_and_retriability() -> None:
    model = TestModel(
        define_model(
            name="m",
            provider="test",
            script=[
                {"error": "overloaded", "status": 529},
                {"error": "bad", "status": 400},
            ],
        )
    )
    with pytest.raises(ProviderError) as overloaded:
        await collect(model, 0)
    assert overloaded.value.status == 529 and overloaded.value.retriable
    with pytest.raises(ProviderError) as bad:
        await collect(model, 1)
    assert bad.value.status == 400 and not bad.value.retriable


async def test_chunk_size_streams_text_in_pieces() -> None:
    model = TestModel(define_model(name="m", provider="test", script=["abcdefgh"], chunk_size=3))
    deltas, response = await collect(model)
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == ["abc", "def", "gh"]
    assert response.text == "abcdefgh"


async def test_delay_ms_waits_before_answering() -> None:
    model = TestModel(define_model(name="m", provider="test", script=["x"], delay_ms=50))
    started = time.monotonic()
    await collect(model)
    assert time.monotonic() - started >= 0.05


async def test_chunk_delay_ms_spreads_the_chunks_over_time() -> None:
    """Each chunk after the first waits `chunk_delay_ms`: the text streams in as a reader would see a real model's."""
    model = TestModel(define_model(name="m", provider="test", script=["abcdefgh"], chunk_size=2, chunk_delay_ms=40))
    arrived: list[float] = []
    started = time.monotonic()
    async for event in model.stream(REQUEST, CallContext("t", 0)):
        if isinstance(event, TextDelta):
            arrived.append(time.monotonic() - started)
    assert len(arrived) == 4 and arrived[0] < 0.04  # the first chunk at once
    assert all(later - earlier >= 0.035 for earlier, later in itertools.pairwise(arrived)), arrived


def test_chunk_delay_ms_is_for_the_test_provider_only() -> None:
    with pytest.raises(ValidationError, match="`chunk_delay_ms` applies to the `test` provider only"):
        define_model(name="m", provider="openai", model="gpt-4.1-mini", chunk_delay_ms=10)


@pytest.mark.parametrize("is_async", [False, True])
async def test_respond_function_gets_the_request(is_async: bool) -> None:
    def respond(request: LLMRequest) -> dict[str, str]:
        return {"text": f"echo: {request.messages[-1].content} ({request.model})"}

    async def respond_async(request: LLMRequest) -> dict[str, str]:
        return respond(request)

    model = TestModel(define_model(name="m", provider="test", respond=respond_async if is_async else respond))
    _, response = await collect(model)
    assert response.text == "echo: hello (m)"


async def test_an_invalid_reply_is_a_clear_error() -> None:
    model = TestModel(define_model(name="m", provider="test", respond=lambda _: {"txt": "typo"}))
    with pytest.raises(ProviderError, match="invalid reply"):
        await collect(model)


def test_a_test_model_needs_a_script_or_respond() -> None:
    with pytest.raises(ValueError, match="needs `script`"):
        define_model(name="m", provider="test")
