"""Running due effects inside the thread's single flight (`semantics.md` §10).

The engine calls `run_queued` before it delivers input, so an effect runs before the next LLM call of a running
thread, and on an idle thread it starts no turn by itself (only messages it queues do). Each handler runs outside
any transaction: one fenced transaction counts the start, another records the end and consumes the inbox row, so a
worker that dies in between leaves the row for the next execution (at least once).
"""

from __future__ import annotations

import logging
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import effects, queue
from app.catalog import Catalog
from app.engine import types
from app.engine.context import load_env
from app.engine.schedule import effect_args_problem
from app.engine.state import RunState, Shared

log = logging.getLogger(__name__)


async def run_queued(
    catalog: Catalog, fernet: Fernet, transaction: types.Transaction, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """Run every effect waiting in the thread's inbox, oldest first, one at a time."""
    while True:
        async with transaction() as (session, thread):
            item = await queue.next_effect(session, thread.id)
            if item is None:
                return
            effect = await effects.start(session, item)
            if effect is None:
                continue
            side = catalog.agent(thread.agent).side(thread.side or "a")
            prompt = catalog.prompts[side.prompt] if side is not None else None
            env = await load_env(session, fernet, catalog, thread, prompt)
        context: dict[str, Any] = {"effect": {"id": str(effect.id), "name": effect.name, "attempt": effect.attempts}}
        shared = Shared(thread, env, transaction, catalog=catalog, fernet=fernet, context=context, sessions=sessions)
        state = shared.state()
        error = env.mask(await _call(catalog, effect.name, effect.args, state))  # shown by the API: no secrets
        if error is not None:
            log.warning("effect %s (%s) of thread %s failed: %s", effect.name, effect.id, thread.id, error)
        async with transaction() as (session, thread):
            await effects.finish(session, effect, item, error)
            thread.attempt = 1  # progress was made: a step after it starts with a fresh crash budget


async def _call(catalog: Catalog, name: str, args: dict[str, Any], state: RunState) -> str | None:
    """Validate the arguments and run the handler; what went wrong, as text, or None."""
    definition = catalog.effects.get(name)
    if definition is None:
        return f"no effect `{name}` is defined (any more)"
    problem = effect_args_problem(definition, args)
    if problem is not None:
        return problem
    try:
        if definition.args_model is None:
            await definition.fn(state)
        else:
            await definition.fn(state, definition.args_model.model_validate(args))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
