"""Schedules the effect `soak_effect` 1–5 s from now (a durable effect, run by a worker); recorded like `work`."""

import random

from app.spec import ThreadState, define_tool
from bench.chaos_record import record


@define_tool(description="Does something a little later.")
async def later(state: ThreadState) -> str:
    record("start", state)
    effect = await state.schedule_effect("soak_effect", {"note": "later"}, delay_ms=random.randint(1000, 5000))
    record("end", state)
    return f"scheduled {effect}"
