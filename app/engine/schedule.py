"""The effect methods of `ThreadState` (§10): schedule, list and cancel the thread's effects, each call one short
transaction on the thread (fenced inside an execution)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from app import effects, errors, tables
from app.catalog import Catalog
from app.engine import tool_arguments, types
from app.engine.messages import as_uuid, refuse_nul
from app.spec.define import EffectDefinition
from app.spec.state import ScheduledEffect


class Schedule:
    """The thread's effects, over the state's transaction."""

    def __init__(self, transaction: types.Transaction, catalog: Catalog) -> None:
        self._transaction = transaction
        self._catalog = catalog

    async def add(self, name: str, args: dict[str, Any] | None, delay_ms: float) -> str:
        """`state.schedule_effect`: the new effect's id."""
        definition = self._catalog.effects.get(name)
        if definition is None:
            known = ", ".join(sorted(self._catalog.effects)) or "none"
            raise errors.UnknownEffect(f"Unknown effect `{name}`. Defined effects: {known}")
        args = {} if args is None else args
        problem = effect_args_problem(definition, args)
        if problem is not None:
            raise errors.Invalid(f"`state.schedule_effect`: {problem}")
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int | float) or not 0 <= delay_ms <= MAX_DELAY_MS:
            raise errors.Invalid("`state.schedule_effect`: `delay_ms` must be a number of milliseconds, 0 to 10 years")
        async with self._transaction() as (session, thread):
            if thread.terminated_at is not None:
                raise errors.ThreadTerminated()
            row = await effects.schedule(session, thread.id, name, args, delay_ms)
        return str(row.id)

    async def pending(self, name: str | None) -> list[ScheduledEffect]:
        """`state.get_scheduled_effects`."""
        async with self._transaction() as (session, thread):
            rows = await effects.list_(session, thread.id, name=name, pending=True)
        return [scheduled_effect(r) for r in rows]

    async def cancel(self, effect_id: str) -> bool:
        """`state.remove_scheduled_effect`: whether a scheduled or queued effect was cancelled."""
        key = as_uuid(effect_id)
        if key is None:
            return False
        async with self._transaction() as (session, thread):
            try:
                return await effects.cancel(session, thread.id, key)
            except (errors.EffectNotFound, errors.EffectNotCancellable):
                return False


MAX_DELAY_MS = 10 * 366 * 86_400_000


def effect_args_problem(definition: EffectDefinition, args: Any) -> str | None:
    """What is wrong with an effect's arguments (JSON, then its argument model), or None."""
    if not isinstance(args, dict):
        return "the arguments must be a dict"
    try:
        refuse_nul(args)
        json.dumps(args, allow_nan=False)
    except (errors.Invalid, TypeError, ValueError) as exc:
        return f"the arguments must be JSON: {exc}"
    if definition.args_model is None:
        return None
    try:
        definition.args_model.model_validate(args)
    except ValidationError as exc:
        return f"invalid arguments for effect `{definition.name}`: {tool_arguments.problems(exc)}"
    return None


def scheduled_effect(row: tables.Effect) -> ScheduledEffect:
    return ScheduledEffect(
        id=str(row.id),
        name=row.name,
        args=row.args,
        run_at=row.run_at,
        status=row.status,
        attempts=row.attempts,
        created_at=row.created_at,
    )
