"""Stop evaluation (`app/engine/stops.py`): pure functions of a step's response and tool outcomes, no database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app import threads
from app.engine import stops, types
from app.llm.base import LLMResponse
from app.spec import ToolResult, define_agent
from app.spec.definitions import SessionToolConfig, SideConfig
from app.spec.messages import ToolCall


def call(name: str, arguments: Any = None, call_id: str = "c1") -> ToolCall:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def outcome(
    name: str, arguments: dict[str, Any] | None = None, *, result: str = "ok", ok: bool = True
) -> types.Outcome:
    status = "success" if ok else "error"
    tool_result = ToolResult(status=status, result=result if ok else None, error=None if ok else result)
    return types.Outcome(call(name, arguments), tool_result, arguments)


def side(**fields: Any) -> SideConfig:
    return SideConfig.model_validate({"prompt": "p", **fields})


AI_HUMAN = define_agent(name="solo", side_a={"prompt": "p"})
DUAL = define_agent(name="duo", type="dual_ai", side_a={"prompt": "p"}, side_b={"prompt": "q"}, max_session_turns=4)


# -- payload ------------------------------------------------------------------------------------------------


def test_a_binding_without_properties_carries_the_result_text() -> None:
    binding = SessionToolConfig(name="done")
    assert stops.payload(binding, outcome("done", {"x": 1}, result="all good")) == {
        "content": "all good",
        "attachments": [],
    }


def test_a_message_property_maps_the_argument_and_a_single_path_becomes_a_list() -> None:
    binding = SessionToolConfig(name="done", message_property="summary", attachments_property="files")
    got = stops.payload(binding, outcome("done", {"summary": "ship it", "files": "/a.txt"}))
    assert got == {"content": "ship it", "attachments": ["/a.txt"]}


def test_a_structured_message_argument_is_stored_as_json() -> None:
    binding = SessionToolConfig(name="done", message_property="summary")
    got = stops.payload(binding, outcome("done", {"summary": {"score": 3}}))
    assert json.loads(got["content"]) == {"score": 3}


def test_a_missing_message_argument_is_empty_text_not_none() -> None:
    binding = SessionToolConfig(name="done", message_property="summary")
    assert stops.payload(binding, outcome("done", {}))["content"] == ""


def test_only_an_attachments_property_keeps_the_result_text_as_content() -> None:
    binding = SessionToolConfig(name="done", attachments_property="files")
    got = stops.payload(binding, outcome("done", {"files": ["/a", "/b"]}, result="text of the result"))
    assert got == {"content": "text of the result", "attachments": ["/a", "/b"]}


# -- stored_result ------------------------------------------------------------------------------------------


def test_a_successful_object_binding_stores_its_mapped_payload_and_string_paths_only() -> None:
    config = side(session_stop={"name": "done", "messageProperty": "m", "attachmentsProperty": "f"})
    text, paths = stops.stored_result(config, outcome("done", {"m": "bye", "f": ["/x", 3]}, result="ok"))
    assert (text, paths) == ("bye", ["/x"])


def test_a_failed_session_call_stores_its_error_text() -> None:
    config = side(session_stop={"name": "done", "messageProperty": "m"})
    assert stops.stored_result(config, outcome("done", {"m": "bye"}, result="bad", ok=False)) == ("bad", [])


def test_a_string_binding_and_other_tools_store_the_result_text() -> None:
    config = side(session_stop="done")
    assert stops.stored_result(config, outcome("done", {"m": "bye"}, result="r")) == ("r", [])
    assert stops.stored_result(None, outcome("done", {"m": "bye"}, result="r")) == ("r", [])
    mapped = side(session_stop={"name": "done", "messageProperty": "m"})
    assert stops.stored_result(mapped, outcome("lookup", {"m": "x"}, result="found")) == ("found", [])


# -- evaluate -----------------------------------------------------------------------------------------------


def test_session_fail_wins_over_session_stop_in_the_same_step() -> None:
    config = side(session_stop="done", session_fail="give_up")
    verdict = stops.evaluate(AI_HUMAN, config, LLMResponse(), [outcome("done"), outcome("give_up")], 1)
    assert (verdict.ends, verdict.reason, verdict.status) == ("session", "session_fail", "failure")


def test_session_stop_ends_the_session_with_its_payload() -> None:
    config = side(session_stop={"name": "done", "messageProperty": "m"})
    verdict = stops.evaluate(AI_HUMAN, config, LLMResponse(), [outcome("done", {"m": "finished"})], 1)
    assert verdict == types.Verdict(
        "session", "session_stop", threads.SessionStatus.SUCCESS, {"content": "finished", "attachments": []}
    )


def test_a_session_tool_call_that_failed_does_not_end_the_session() -> None:
    config = side(session_stop="done", stop_on_response=False)
    verdict = stops.evaluate(AI_HUMAN, config, LLMResponse(), [outcome("done", ok=False)], 1)
    assert verdict == types.GO_ON


def test_the_stop_tool_ends_the_turn_even_when_it_failed() -> None:
    config = side(stop_tool="finish", stop_on_response=False)
    verdict = stops.evaluate(AI_HUMAN, config, LLMResponse(), [outcome("finish", ok=False)], 1)
    assert (verdict.ends, verdict.reason) == ("turn", "stop_tool")


@pytest.mark.parametrize(
    ("text", "calls", "ends"),
    [
        ("an answer", [], "turn"),
        ("   \n", [], "nothing"),  # whitespace is no answer
        ("working on it", [call("lookup")], "nothing"),  # a response with tool calls goes on
    ],
)
def test_stop_on_response_needs_text_and_no_tool_calls(text: str, calls: list[ToolCall], ends: str) -> None:
    verdict = stops.evaluate(AI_HUMAN, side(), LLMResponse(text=text, tool_calls=calls), [], 1)
    assert verdict.ends == ends


def test_an_answer_whose_calls_hooks_dropped_still_made_calls() -> None:
    """A step resumed after a hook dropped every call its answer made (a blocking child's result, `turns.open_work`)
    goes on as the step that made them would have."""
    response = LLMResponse(text="working on it")  # as stored: its only call is gone
    assert stops.evaluate(AI_HUMAN, side(), response, [], 1, made_calls=True) == types.GO_ON
    assert stops.evaluate(AI_HUMAN, side(), response, [], 1, made_calls=False).ends == "turn"


def test_max_steps_ends_the_turn_only_once_reached() -> None:
    config = side(stop_on_response=False, max_steps=3)
    response = LLMResponse(text="more")
    assert stops.evaluate(AI_HUMAN, config, response, [], 2) == types.GO_ON
    assert stops.evaluate(AI_HUMAN, config, response, [], 3) == types.Verdict("turn", "max_steps")


def test_without_stop_on_response_an_answer_goes_on() -> None:
    config = side(stop_on_response=False)
    assert stops.evaluate(AI_HUMAN, config, LLMResponse(text="done"), [], 50) == types.GO_ON


# -- session_cap --------------------------------------------------------------------------------------------


def test_the_session_cap_ends_a_dual_ai_session_once_reached() -> None:
    assert stops.session_cap(DUAL, 3) == types.GO_ON
    assert stops.session_cap(DUAL, 4) == types.Verdict("session", "max_session_turns", threads.SessionStatus.SUCCESS)


def test_a_subagent_owing_a_result_fails_at_the_cap() -> None:
    assert stops.session_cap(DUAL, 4, owes_result=True).status == "failure"


def test_the_session_cap_never_applies_to_ai_human_or_without_a_limit() -> None:
    uncapped = define_agent(name="duo", type="dual_ai", side_a={"prompt": "p"}, side_b={"prompt": "q"})
    assert stops.session_cap(AI_HUMAN, 1000) == types.GO_ON
    assert stops.session_cap(uncapped, 1000) == types.GO_ON


# -- stored_text --------------------------------------------------------------------------------------------


def test_the_stop_tool_response_property_replaces_the_stored_text() -> None:
    config = side(stop_tool="finish", stop_tool_response_property="answer")
    response = LLMResponse(
        text="thinking aloud", tool_calls=[call("other", {"answer": "no"}), call("finish", {"answer": "42"})]
    )
    assert stops.stored_text(response, config) == "42"


@pytest.mark.parametrize("arguments", ['{"answer": 42}', "not json", "[1, 2]", "{}"])
def test_an_unusable_stop_tool_argument_keeps_the_text(arguments: str) -> None:
    config = side(stop_tool="finish", stop_tool_response_property="answer")
    response = LLMResponse(text="the text", tool_calls=[call("finish", arguments)])
    assert stops.stored_text(response, config) == "the text"


def test_empty_text_is_stored_as_none() -> None:
    assert stops.stored_text(LLMResponse(text=""), side()) is None


def test_a_null_attachments_argument_means_no_attachments() -> None:
    binding = SessionToolConfig(name="done", attachments_property="files")
    assert stops.payload(binding, outcome("done", {"files": None}, result="r")) == {"content": "r", "attachments": []}
