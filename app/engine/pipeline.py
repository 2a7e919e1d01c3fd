"""The parts every step runs, a thread's (`run.py`) and a subprompt's (`subprompts.py`) alike (`semantics.md` §3,
§7.2): the request built — the history as the prompt's `filter_messages` hook leaves it, the prompt's tools, its
`prefilter_llm_history` hook, the children's registry, images read in — with the pending message the answer will
stream into; and, after the model call (`calls.Caller.call`, outside any transaction), the answer stored in that
message with the request's log row. Each part runs inside the caller's transaction, through the hooks of the prompt
that makes the call (§10)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import children, messages, tables
from app.catalog import Catalog
from app.engine import calls, child_tools, context, history, hooks, stops, transcript, types
from app.llm.base import LLMRequest, LLMResponse, ProviderError
from app.spec.definitions import PromptDefinition, Side, SideConfig
from app.spec.messages import LLMMessage


async def request(
    session: AsyncSession,
    thread: tables.Thread,
    catalog: Catalog,
    prompt: PromptDefinition,
    config: SideConfig,
    side: Side,
    rows: list[tables.Message],
    turn_start: int,
    env: types.Env,
    hook_runner: hooks.Hooks,
    *,
    held: history.History | None = None,
) -> LLMRequest:
    """What the model of `prompt` is sent for the acting side's step. `rows`: the stored messages the history is
    made of (`held`: the worker's copy of them, when the caller holds one: its plain values and its transcript).
    Raises `types.MissingVariable` when the prompt's text needs a variable the thread does not have."""
    assembled: Sequence[transcript.HistoryRow] = rows if held is None else held.seen()
    kept = None if held is None else held.transcript
    if hook_runner.runs("filter_messages"):
        assembled, kept = await hook_runner.filter_messages(rows, side, prompt, turn_start), None
    kids = await children.listed(session, thread)  # as they are now: the registry, and who is at `max_instances`
    full = child_tools.at_cap(catalog, prompt, env, kids)
    made = context.build_request(catalog, prompt, config, side, assembled, turn_start, env, full, kept)
    made.messages = await hook_runner.prefilter_llm_history(made.messages)
    registry = children.registry_message(kids)
    if registry is not None:  # after the history, so the model sees its children's current state
        made.messages.append(LLMMessage("system", registry))
    await calls.inline_images(session, thread.id, made.messages)
    return made


async def pending(
    session: AsyncSession,
    thread: tables.Thread,
    prompt: PromptDefinition,
    side: Side,
    hook_runner: hooks.Hooks,
    *,
    tags: dict[str, Any] | None = None,
) -> tables.Message:
    """The step's pending message, through the `before_create_message` / `after_create_message` hooks. `tags`: the
    engine's own fields that a subprompt's messages keep whatever the hooks do (`hooks.tagged`)."""
    tags = tags or {}
    role = messages.role_of(side)
    fields = {
        "side": side,
        "status": messages.Status.PENDING,
        "prompt": prompt.name,
        "model": prompt.model,
        "session_number": thread.session_number,
        **tags,
    }
    shaped = hooks.tagged(await hook_runner.before_create_message(role, fields), tags)
    # without hooks nothing reads the new row before the commit: its INSERT rides with the transaction's events
    message = await messages.add(session, thread.id, role, later=hook_runner.none, **shaped)
    await hook_runner.after_create_message(message)
    return message


async def store(
    session: AsyncSession,
    message: tables.Message,
    result: calls.Result,
    config: SideConfig,
    hook_runner: hooks.Hooks,
    *,
    tags: dict[str, Any] | None = None,
    later: bool = False,
) -> LLMResponse | None:
    """The call's log row, and its answer in the pending `message` through the `before_update_message` /
    `after_update_message` hooks: completed with the text, tool calls, reasoning and usage, or failed with the
    provider's error; the response, or None when the call failed. `tags`: as for `pending`; `later`: the completed
    message may ride with the transaction's events (nothing reads it back before)."""
    await calls.write(session, result)  # the request's log row commits with the message it answers
    response = result.response
    if isinstance(response, ProviderError):
        # the message says why as the event does (masked already: `calls._Recorder.close`)
        updates = messages.failed(message, messages.failure("llm_error", response.message))
        edited = await hook_runner.before_update_message(message, updates)
        await messages.save(session, message, **hooks.tagged(edited, tags or {}))
        await hook_runner.after_update_message(message)
        return None
    updates = {
        "status": messages.Status.COMPLETED,
        "content": stops.stored_text(response, config),
        "tool_calls": list(response.tool_calls) or None,
        "reasoning_content": response.reasoning,
        "reasoning_details": response.reasoning_details,
        "model": result.model.name,
        "usage": response.usage.as_dict(),
    }
    edited = await hook_runner.before_update_message(message, updates)
    await messages.save(session, message, later=later, **hooks.tagged(edited, tags or {}))
    await hook_runner.after_update_message(message)
    return response
