"""Tool execution (§7.1): validate the arguments, call the function, turn anything raised into an error result."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from pydantic import BaseModel, ValidationError

from app import errors, logs, masking, tables, tracing
from app.catalog import Catalog
from app.engine import tool_arguments, types
from app.spec.define import ToolDefinition
from app.spec.definitions import SideConfig
from app.spec.messages import ToolCall
from app.spec.results import ToolResult

log = logging.getLogger(__name__)


def json_secrets(secrets: list[str]) -> list[str]:
    """Secret values as they may appear inside JSON text too: escaped (`"`, `\\`, controls) and `\\u`-escaped."""
    spelled = {s for s in secrets if s}
    for secret in list(spelled):
        spelled.add(json.dumps(secret)[1:-1])
        spelled.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    return sorted(spelled, key=len, reverse=True)  # the longest first: a secret inside another is masked whole


def log_row(
    thread_id: uuid.UUID,
    call: ToolCall,
    result: ToolResult,
    latency_ms: float | None,
    secrets: list[str],
    *,
    child: uuid.UUID | None = None,
) -> tables.Log:
    """The `logs` row of one tool call (`logs.tool`), known secret values masked in its arguments and its error;
    `child`: the subagent its result speaks for."""
    raw: Any = call["function"].get("arguments") or ""
    raw = raw if isinstance(raw, str) else json.dumps(raw, default=str)
    return logs.tool(
        thread_id,
        name=call["function"]["name"],
        call_id=call["id"],
        status=result.status,
        error=masking.scrub(result.error, secrets) if result.status == "error" and result.error else None,
        latency_ms=latency_ms,
        arguments=(masking.scrub(raw, json_secrets(secrets)), len(raw.encode())),
        error_code=result.error_code,
        subagent_id=str(child) if child is not None else None,
    )


def _validation_text(name: str, exc: ValidationError) -> str:
    return f"Invalid arguments for tool `{name}`: {tool_arguments.problems(exc)}"


def normalise(value: Any) -> ToolResult:
    """A tool's return value as a `ToolResult`: strings as they are, anything else as JSON."""
    if isinstance(value, ToolResult):
        return value
    if value is None:
        return ToolResult(status="success", result="")
    if isinstance(value, str):
        return ToolResult(status="success", result=value)
    if isinstance(value, BaseModel):
        return ToolResult(status="success", result=value.model_dump_json())
    return ToolResult(status="success", result=json.dumps(value, default=str))


def _session_arguments_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Check a built-in session tool's arguments against its (flat) schema: required, known, typed."""
    props: dict[str, Any] = schema.get("properties", {})
    missing = [p for p in schema.get("required", []) if p not in arguments]
    if missing:
        return "missing " + ", ".join(f"`{p}`" for p in missing)
    unknown = [k for k in arguments if k not in props]
    if unknown:
        return "unknown " + ", ".join(f"`{k}`" for k in unknown)
    for key, value in arguments.items():
        if props[key].get("type") == "string" and not isinstance(value, str):
            return f"`{key}` must be a string"
        if props[key].get("type") == "array" and not isinstance(value, list | str):
            return f"`{key}` must be a list of paths"
    return None


async def execute(
    catalog: Catalog, offered: dict[str, types.OfferedTool], call: ToolCall, state: types.ToolState
) -> types.Outcome:
    """Run one tool call; never raises for a bad call or a failing tool. Its span names the tool and says how it
    ended, never what it was given or gave back."""
    name = call["function"]["name"]
    with tracing.span(f"execute_tool {name}", traced(call, offered.get(name))) as span:
        outcome = await _execute(catalog, offered, call, state)
        if span is not None:
            span.set_attribute("agents.tool.status", outcome.result.status)
            if outcome.result.status != "success":
                tracing.failed(span, "tool_error")
        return outcome


def traced(call: ToolCall, tool: types.OfferedTool | None) -> dict[str, str]:
    """A tool call's span attributes (GenAI semantic conventions)."""
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call["function"]["name"],
        "gen_ai.tool.call.id": call["id"],
        "agents.tool.kind": tool.kind if tool is not None else "unknown",
    }


async def _execute(
    catalog: Catalog, offered: dict[str, types.OfferedTool], call: ToolCall, state: types.ToolState
) -> types.Outcome:
    name = call["function"]["name"]
    tool = offered.get(name)
    if tool is None:
        known = ", ".join(sorted(offered)) or "none"
        return types.Outcome(call, types.error(f"Unknown tool `{name}`. Available tools: {known}"), None)
    try:
        arguments = tool_arguments.parse_arguments(call["function"]["arguments"])
    except ValueError as exc:
        return types.Outcome(call, types.error(f"Invalid arguments for tool `{name}`: {exc}"), None)
    if tool.kind == "session":
        problem = _session_arguments_problem(tool.parameters, arguments)
        if problem:
            return types.Outcome(call, types.error(f"Invalid arguments for tool `{name}`: {problem}"), arguments)
        return types.Outcome(call, ToolResult(status="success", result="ok"), arguments)
    tool_state = state.with_tool(call["id"], tool.entry.options, tool.entry.env)
    if tool.kind == "subprompt":
        return types.Outcome(call, await tool_state.run_subprompt(tool.entry, arguments), arguments)
    if tool.kind == "handoff":
        return types.Outcome(call, await tool_state.hand_off(name), arguments)
    definition = catalog.tools.get(name)
    if definition is None:  # a kind this path cannot run (the step loop runs it itself)
        return types.Outcome(call, types.error(f"Tool `{name}` cannot be called here"), arguments)
    return types.Outcome(call, await run(name, definition, arguments, tool_state), arguments)


async def check_attachments(side: SideConfig | None, outcome: types.Outcome, state: types.ToolState) -> types.Outcome:
    """A session tool's `attachmentsProperty` must name files of this thread; otherwise the call is an error the
    model sees (and the session does not end on it)."""
    if side is None or outcome.result.status != "success" or not outcome.arguments:
        return outcome
    name = outcome.call["function"]["name"]
    for which in ("stop", "fail", "status"):
        binding = side.binding(which)
        if binding is None or binding.name != name or not binding.attachments_property:
            continue
        paths = outcome.arguments.get(binding.attachments_property) or []
        paths = [paths] if isinstance(paths, str) else paths
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            text = f"`{binding.attachments_property}` must be a list of file paths"
            return types.Outcome(
                outcome.call, types.error(f"Invalid arguments for tool `{name}`: {text}"), outcome.arguments
            )
        missing = []
        for path in paths:
            try:
                record = await state.stat_file(path)
            except errors.AgentsError:  # a malformed path names no file either
                record = None
            if record is None or record.type != "file":
                missing.append(path)
        if missing:
            return types.Outcome(
                outcome.call, types.error(tool_arguments.missing_attachments(missing)), outcome.arguments
            )
    return outcome


async def run(name: str, definition: ToolDefinition, arguments: dict[str, Any], state: types.ToolState) -> ToolResult:
    """Validate the arguments, call the tool, and turn anything it raises into an error result."""
    args: BaseModel | None = None
    if definition.args_model is not None:
        try:
            args = definition.args_model.model_validate(arguments)
        except ValidationError as exc:
            return types.error(_validation_text(name, exc))
    limit = definition.timeout or state.tool_timeout
    timer = asyncio.timeout(limit)
    try:
        async with timer:
            value = await (definition.fn(state) if args is None else definition.fn(state, args))
    except Exception as exc:  # `errors.Aborted` and cancellation are not `Exception`s: they end the execution
        if timer.expired():
            log.warning("thread %s: tool %s ran past its %g s limit", state.thread_id, name, limit)
            return types.error(f"Tool `{name}` did not finish within {limit:g} s and was stopped")
        # the text may hold a secret: it goes to the result (which the model sees), the log has the type
        log.warning("thread %s: tool %s raised %s", state.thread_id, name, type(exc).__name__)
        return types.error(f"Tool `{name}` failed: {type(exc).__name__}: {exc}")
    return normalise(value)
