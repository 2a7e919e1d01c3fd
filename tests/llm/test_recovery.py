"""Tool calls written as text: each strategy, their order, what counts as a call, and what is left as text."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.llm.base import (
    CallContext,
    Done,
    LLMRequest,
    LLMResponse,
    LLMTool,
    ProviderError,
    StreamEvent,
    TextDelta,
    Usage,
)
from app.llm.recovery import RecoveringModel, recover, recover_failed_generation
from app.spec import define_model
from app.spec.messages import LLMMessage, ToolCall

TOOLS = [
    LLMTool("get_weather", "Weather of a city", {"type": "object", "properties": {"city": {"type": "string"}}}),
    LLMTool("search", "Search the web", {"type": "object", "properties": {"q": {"type": "string"}}}),
]


def calls(response: LLMResponse) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in response.tool_calls]


def test_llama_style_with_and_without_the_closing_bracket() -> None:
    response = recover(
        LLMResponse(
            text='<function=get_weather>{"city": "Paris"}</function>\n<function=search{"q": "rain"}</function>'
        ),
        TOOLS,
    )
    assert calls(response) == [("get_weather", {"city": "Paris"}), ("search", {"q": "rain"})]
    assert response.text == ""
    assert response.finish_reason == "tool_calls"


def test_llama_style_without_the_closing_tag_or_with_empty_arguments() -> None:
    unclosed = recover(LLMResponse(text='Checking. <function=get_weather>{"city": "Oslo"}'), TOOLS)
    assert calls(unclosed) == [("get_weather", {"city": "Oslo"})]
    assert unclosed.text == "Checking."
    empty = recover(LLMResponse(text="<function=search></function>"), TOOLS)
    assert calls(empty) == [("search", {})]


def test_a_bare_function_tag_is_a_mention_not_a_call() -> None:
    response = LLMResponse(text="I could use <function=search> for that.")
    assert recover(response, TOOLS) is response


def test_tool_call_wrappers_several_with_arguments_or_parameters() -> None:
    text = (
        "Let me look.\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
        "and also\n"
        '<tool_call>\n{"name": "search", "parameters": {"q": "news"}}\n</tool_call>\n'
        '<tool_call>{"name": "search"}</tool_call>'
    )
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("get_weather", {"city": "Paris"}), ("search", {"q": "news"}), ("search", {})]
    assert response.text == "Let me look.\nand also"


def test_json_code_blocks_with_one_call_or_a_list() -> None:
    text = (
        "First:\n```json\n"
        '{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
        "```\nThen:\n```JSON\n"
        '[{"name": "search", "parameters": {"q": "a"}}, {"name": "search", "arguments": {"q": "b"}}]\n'
        "```\nDone."
    )
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("get_weather", {"city": "Rome"}), ("search", {"q": "a"}), ("search", {"q": "b"})]
    assert response.text == "First:\nThen:\nDone."


def test_raw_json_in_prose() -> None:
    text = 'Sure! {"name": "get_weather", "arguments": {"city": "Lima"}} I will report back.'
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("get_weather", {"city": "Lima"})]
    assert response.text == "Sure!\nI will report back."


def test_raw_json_nested_braces_and_braces_and_quotes_inside_strings() -> None:
    arguments = {"q": 'a } b { "c" ] \\', "filters": {"range": {"from": 1, "to": [2, {"x": "}"}]}}}
    text = "Calling " + json.dumps({"name": "search", "arguments": arguments}) + " now {not json}"
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("search", arguments)]
    assert response.text == "Calling\nnow {not json}"


def test_raw_json_lists_wrappers_and_the_openai_shape() -> None:
    text = (
        '[{"name": "search", "arguments": {"q": "x"}}] '
        '{"tool_calls": [{"name": "get_weather", "parameters": {"city": "Kyiv"}}]} '
        '{"type": "function", "function": {"name": "search", "arguments": "{\\"q\\": \\"y\\"}"}}'
    )
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("search", {"q": "x"}), ("get_weather", {"city": "Kyiv"}), ("search", {"q": "y"})]
    assert response.text == ""


def test_raw_json_needs_arguments_and_an_object_of_them() -> None:
    for text in (
        '{"name": "search"}',
        '{"name": "search", "arguments": ["x"]}',
        '{"name": "search", "arguments": "not json"}',
        '{"name": "search", "arguments": "[1]"}',
    ):
        response = LLMResponse(text=text)
        assert recover(response, TOOLS) is response, text


def test_smart_quotes_are_read_as_ascii_and_kept_in_the_remaining_text() -> None:
    text = "He said “ok”. {“name”: “search”, “arguments”: {“q”: “it’s here”}}"
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("search", {"q": "it's here"})]
    assert response.text == "He said “ok”."
    tagged = recover(LLMResponse(text="<tool_call>{“name”: “get_weather”}</tool_call>"), TOOLS)
    assert calls(tagged) == [("get_weather", {})]


def test_smart_quotes_inside_an_ascii_string_are_left_as_written() -> None:
    text = '{"name": "search", "arguments": {"q": "say “hi”"}}'
    assert calls(recover(LLMResponse(text=text), TOOLS)) == [("search", {"q": "say “hi”"})]


def test_unknown_tool_names_are_left_as_text() -> None:
    text = (
        '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"q": "z"}}</tool_call>'
    )
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("search", {"q": "z"})]
    assert response.text == '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>'
    for unknown in (
        '<function=delete_everything>{"path": "/"}</function>',
        '{"name": "delete_everything", "arguments": {}}',
        # a list is taken whole or not at all
        '```json\n[{"name": "search", "arguments": {}}, {"name": "delete_everything", "arguments": {}}]\n```',
    ):
        original = LLMResponse(text=unknown)
        assert recover(original, TOOLS) is original, unknown


def test_malformed_json_is_ignored() -> None:
    bad = '{"name": "search", "arguments": {"q": "x",}}'
    for text in (bad, f"<tool_call>{bad}</tool_call>", f"```json\n{bad}\n```", '<function=search>{"q": }</function>'):
        original = LLMResponse(text=text)
        assert recover(original, TOOLS) is original, text
    response = recover(LLMResponse(text=bad + ' {"name": "search", "arguments": {"q": "ok"}}'), TOOLS)
    assert calls(response) == [("search", {"q": "ok"})]
    assert response.text == bad


def test_the_first_strategy_that_finds_a_call_wins() -> None:
    text = '<function=search>{"q": "llama"}</function> {"name": "get_weather", "arguments": {"city": "Paris"}}'
    response = recover(LLMResponse(text=text), TOOLS)
    assert calls(response) == [("search", {"q": "llama"})]
    assert response.text == '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_bracket_heavy_text_stays_fast() -> None:
    call = '{"name": "search", "arguments": {"q": "x"}}'
    started = time.monotonic()
    noises = ["{" * 20_000, "[" * 20_000 + "]" * 20_000, '"{' * 20_000, '["{", ' * 10_000, '{"a": "\\"{' * 5_000]
    for noise in noises:
        assert calls(recover(LLMResponse(text=f"{noise} {call}"), TOOLS)) == [("search", {"q": "x"})]
    assert time.monotonic() - started < 2  # a matcher re-run from every bracket took tens of seconds


def test_recovered_calls_shape_ids_and_untouched_fields() -> None:
    original = LLMResponse(
        text='<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
        reasoning="thinking",
        usage=Usage(input_tokens=3, output_tokens=5),
    )
    response = recover(original, TOOLS)
    assert response.tool_calls == [
        {
            "id": "recovered_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
        },
        {"id": "recovered_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
    ]
    assert (response.reasoning, response.usage) == ("thinking", Usage(input_tokens=3, output_tokens=5))
    assert original.tool_calls == []  # a new response, the original is left as it was
    prefixed = recover(original, TOOLS, prefix="recovered_7")
    assert [c["id"] for c in prefixed.tool_calls] == ["recovered_7_0", "recovered_7_1"]


def test_native_calls_no_tools_or_no_calls_leave_the_response_unchanged() -> None:
    native: ToolCall = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    with_native = LLMResponse(text=text, tool_calls=[native], finish_reason="tool_calls")
    assert recover(with_native, TOOLS) is with_native
    no_tools = LLMResponse(text=text)
    assert recover(no_tools, []) is no_tools
    plain = LLMResponse(text="The weather in {city} is nice.")
    assert recover(plain, TOOLS) is plain


def test_groq_failed_generation_is_recovered() -> None:
    body = {
        "error": {
            "message": "Failed to call a function. See 'failed_generation' for more details.",
            "type": "invalid_request_error",
            "code": "tool_use_failed",
            "failed_generation": '<function=get_weather>{"city": "Paris"}</function>',
        }
    }
    response = recover_failed_generation(body, TOOLS)
    assert response is not None
    assert calls(response) == [("get_weather", {"city": "Paris"})]
    assert (response.text, response.finish_reason, response.tool_calls[0]["id"]) == ("", "tool_calls", "recovered_0")


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": "tool_use_failed", "failed_generation": "I cannot call tools."}},
        {"error": {"code": "tool_use_failed", "failed_generation": '{"name": "nope", "arguments": {}}'}},
        {"error": {"code": "tool_use_failed"}},
        {"error": "bad request"},
        {},
    ],
)
def test_groq_failed_generation_without_a_call_gives_none(body: dict[str, Any]) -> None:
    assert recover_failed_generation(body, TOOLS) is None


def test_the_model_flag_in_both_spellings() -> None:
    assert define_model(name="m", provider="test", script=["x"]).text_tool_calls is False
    assert define_model(name="m", provider="test", script=["x"], textToolCalls=True).text_tool_calls is True
    assert define_model(name="m", provider="openai", model="llama-3.3-70b", text_tool_calls=True).text_tool_calls


class Scripted:
    """A model that streams `text` and answers with it, or fails with `error`."""

    provider = "scripted"

    def __init__(self, text: str = "", error: ProviderError | None = None) -> None:
        self.text, self.error = text, error

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        if self.error is not None:
            raise self.error
        yield TextDelta(self.text)
        yield Done(LLMResponse(text=self.text))


async def answered(model: RecoveringModel) -> tuple[list[StreamEvent], LLMResponse]:
    request = LLMRequest(model="m", messages=[LLMMessage("user", "weather?")], tools=TOOLS)
    events = [e async for e in model.stream(request, CallContext("t", 0))]
    assert isinstance(events[-1], Done)
    return events[:-1], events[-1].response


async def test_a_recovering_model_recovers_text_calls_only_for_text_tool_call_models() -> None:
    text = '<function=get_weather>{"city": "Paris"}</function>'
    deltas, response = await answered(RecoveringModel(Scripted(text), "recovered_m1", text=True))
    assert deltas == [TextDelta(text)]  # the deltas went out as the model wrote them
    assert calls(response) == [("get_weather", {"city": "Paris"})]
    assert response.tool_calls[0]["id"] == "recovered_m1_0"
    _, untouched = await answered(RecoveringModel(Scripted(text), "recovered_m1", text=False))
    assert (untouched.text, untouched.tool_calls) == (text, [])


async def test_a_recovering_model_answers_with_a_refused_generation_that_holds_a_call() -> None:
    refused = ProviderError("tool_use_failed", status=400, kind="bad_request")
    refused.failed_generation = '<function=search>{"q": "rain"}</function>'
    _, response = await answered(RecoveringModel(Scripted(error=refused), "r", text=False))
    assert calls(response) == [("search", {"q": "rain"})]
    refused.failed_generation = "I cannot call tools."
    with pytest.raises(ProviderError, match="tool_use_failed"):
        await answered(RecoveringModel(Scripted(error=refused), "r", text=False))
    with pytest.raises(ProviderError, match="down"):
        await answered(RecoveringModel(Scripted(error=ProviderError("down", status=503)), "r", text=True))
