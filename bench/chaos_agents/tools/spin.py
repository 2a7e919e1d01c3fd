"""Computes for `CHAOS_SPIN_S` seconds on the event loop (an `async def` that never awaits): a tool that blocks."""

import os
import time

from app.spec import ThreadState, define_tool
from bench.chaos_record import record


@define_tool(description="Computes hard.")
async def spin(state: ThreadState) -> str:
    record("start", state)
    end = time.monotonic() + float(os.environ.get("CHAOS_SPIN_S", "4"))
    while time.monotonic() < end:
        pass
    record("end", state)
    return "spun"
