"""Stop evaluation after a step's tools ran, in the order of `semantics.md` §5."""

from __future__ import annotations

import json
from typing import Any, Literal

from app import threads
from app.engine import tool_arguments, types
from app.llm.base import LLMResponse
from app.spec.definitions import AgentDefinition, SessionToolConfig, SideConfig


def payload(binding: SessionToolConfig, outcome: types.Outcome) -> dict[str, Any]:
    """The canonical payload of a session tool call: the mapped message and attachments, or the result text."""
    args = outcome.arguments or {}
    if binding.message_property is None and binding.attachments_property is None:
        return {"content": outcome.result.text, "attachments": []}
    content: Any = args.get(binding.message_property) if binding.message_property else outcome.result.text
    if content is not None and not isinstance(content, str):
        content = json.dumps(content)
    attachments: Any = args.get(binding.attachments_property, []) if binding.attachments_property else []
    if isinstance(attachments, str):
        attachments = [attachments]
    return {"content": content or "", "attachments": list(attachments or [])}  # `null` means none


def stored_result(side: SideConfig | None, outcome: types.Outcome) -> tuple[str, list[str]]:
    """The tool message of a call: a successful session tool bound in object form stores its mapped payload,
    with the paths of `attachmentsProperty` to attach (§5); anything else stores its result text."""
    if side is not None and outcome.result.status == "success":
        name = outcome.call["function"]["name"]
        for which in ("stop", "fail", "status"):
            binding = side.binding(which)
            if (
                binding is not None
                and binding.name == name
                and (binding.message_property or binding.attachments_property)
            ):
                mapped = payload(binding, outcome)
                return mapped["content"], [p for p in mapped["attachments"] if isinstance(p, str)]
    return outcome.result.text, []


def _successful(binding: SessionToolConfig | None, outcomes: list[types.Outcome]) -> types.Outcome | None:
    if binding is None:
        return None
    for outcome in outcomes:
        if outcome.call["function"]["name"] == binding.name and outcome.result.status == "success":
            return outcome
    return None


def evaluate(
    agent: AgentDefinition,
    side: SideConfig,
    response: LLMResponse,
    outcomes: list[types.Outcome],
    turn_steps: int,
    *,
    made_calls: bool | None = None,
) -> types.Verdict:
    """Session tools first, then the side's turn rules (stop tool, stop on response, max steps). `made_calls`:
    whether the answer made tool calls, when hooks may have dropped them all from `response` since (by default,
    whether it holds any)."""
    bound: tuple[tuple[Literal["fail", "stop"], threads.SessionStatus], ...] = (
        ("fail", threads.SessionStatus.FAILURE),
        ("stop", threads.SessionStatus.SUCCESS),
    )
    for which, status in bound:
        binding = side.binding(which)
        outcome = _successful(binding, outcomes)
        if binding is not None and outcome is not None:
            return types.Verdict("session", f"session_{which}", status, payload(binding, outcome))
    called = {o.call["function"]["name"] for o in outcomes}
    if side.stop_tool is not None and side.stop_tool in called:
        return types.Verdict("turn", "stop_tool")
    made_calls = bool(response.tool_calls) if made_calls is None else made_calls
    if side.stop_on_response and response.text.strip() and not made_calls:
        return types.Verdict("turn", "stop_on_response")
    if side.max_steps is not None and turn_steps >= side.max_steps:
        return types.Verdict("turn", "max_steps")
    return types.GO_ON


def session_cap(agent: AgentDefinition, session_turns: int, *, owes_result: bool = False) -> types.Verdict:
    """After a turn ends: `maxSessionTurns` counts both sides' turns together (`dual_ai` only). `owes_result`: a
    subagent whose agent has terminal session tools, for which reaching the cap without one is a failure (§5, §6.4)."""
    if agent.type == "dual_ai" and agent.max_session_turns is not None and session_turns >= agent.max_session_turns:
        status = threads.SessionStatus.FAILURE if owes_result else threads.SessionStatus.SUCCESS
        return types.Verdict("session", "max_session_turns", status)
    return types.GO_ON


def stored_text(response: LLMResponse, side: SideConfig) -> str | None:
    """The stored text; a `stopTool` call's `stopToolResponseProperty` argument replaces it (§3.6)."""
    if side.stop_tool and side.stop_tool_response_property:
        for call in response.tool_calls:
            if call["function"]["name"] != side.stop_tool:
                continue
            try:
                value = tool_arguments.parse_arguments(call["function"]["arguments"]).get(
                    side.stop_tool_response_property
                )
            except ValueError:
                continue
            if isinstance(value, str):
                return value
    return response.text or None
