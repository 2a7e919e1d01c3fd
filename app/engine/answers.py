"""Where the model's answer becomes the step's stored message (`semantics.md` §3, step 5): the pending message
completed with the text, tool calls, reasoning and usage, or failed with the provider's error — through the
`before_update_message` / `after_update_message` hooks (§10). A thread's step (`run.py`) and a subprompt's step
(`subprompts.py`) both store their answer here."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app import messages, tables
from app.engine import calls, hooks, stops
from app.llm.base import LLMResponse, ProviderError
from app.spec.definitions import SideConfig


async def store(
    session: AsyncSession,
    message: tables.Message,
    result: calls.Result,
    side: SideConfig,
    hook_runner: hooks.Hooks,
    *,
    tags: dict[str, Any] | None = None,
    later: bool = False,
) -> LLMResponse | None:
    """Store the call's answer in its pending `message`; the response, or None when the call failed. `tags`: the
    engine's own fields a subprompt's messages keep whatever the hooks do (`hooks.tagged`); `later`: the completed
    message may ride with the transaction's events (nothing reads it back before)."""
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
        "content": stops.stored_text(response, side),
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
