"""`state.queue_tool` (§7.4): a tool call queued by a tool, a hook or code outside the thread's execution. Inside a
tool call of the running step the call joins that step; anywhere else it is input the engine delivers as the acting
side's own call."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from app import errors, inputs, messages, queue, tables, threads
from app.catalog import Catalog
from app.engine import types
from app.engine.context import offered_tools
from app.engine.messages import refuse_nul
from app.spec.definitions import Side
from app.spec.messages import ToolCall
from app.spec.state import ExecutionState


async def queue_tool(
    transaction: types.Transaction,
    catalog: Catalog,
    env: types.Env,
    execution: ExecutionState | None,
    queue_call: Callable[[ToolCall], None] | None,
    name: str,
    args: dict[str, Any] | None,
) -> str:
    """Queue a call of `name` with `args`; its id. `queue_call` (given to a step's tool calls) adds a call to the
    step's calls still to run."""
    if args is not None and not isinstance(args, dict):
        raise errors.Invalid("`state.queue_tool`: the arguments must be a dict")
    refuse_nul(name, args)
    try:
        arguments = json.dumps(args or {})
    except (TypeError, ValueError) as exc:
        raise errors.Invalid(f"`state.queue_tool`: the arguments must be JSON: {exc}") from exc
    call: ToolCall = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    async with transaction() as (session, thread):
        side = execution.side if execution is not None else (thread.side or "a")
        _check_offered(catalog, env, thread, side, name)
        owner = None
        if execution is not None and execution.tool_call_id is not None and queue_call is not None:
            owner = await messages.holding(session, thread.id, execution.tool_call_id, role="assistant")
        if owner is None:  # not inside a tool call: a queued call the engine delivers as the side's own (§7.4)
            if thread.terminated_at is not None:
                raise errors.ThreadTerminated()
            await queue.enqueue(session, thread.id, inputs.Kind.TOOL, {"call": call})
            if thread.status == threads.Status.IDLE:
                await threads.set_status(session, thread, threads.Status.QUEUED)
            return call["id"]
        # the call joins the running step, paired in history with the message that made the running call
        await messages.save(session, owner, tool_calls=[*(owner.tool_calls or []), call])
    assert queue_call is not None
    queue_call(call)
    return call["id"]


def _check_offered(catalog: Catalog, env: types.Env, thread: tables.Thread, side: Side, name: str) -> None:
    """A queued call runs like the model's own, so it must name a tool the acting side is offered."""
    agent = catalog.agent(thread.agent)
    config = agent.side(side)
    offered = set()
    if config is not None:
        prompt = catalog.prompts[config.prompt]
        # with the env: an `optional` subagent the side is offered is one it may queue (§6.6)
        offered = {t.name for t in offered_tools(catalog, prompt, config, env)}
    if name not in offered:
        known = ", ".join(sorted(offered)) or "none"
        raise errors.Invalid(f"`state.queue_tool`: side {side} is not offered a tool `{name}` (offered: {known})")
