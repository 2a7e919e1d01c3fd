"""Works for a random short while; records when each execution of each call started and ended (`CHAOS_DIR`)."""

import asyncio
import os
import random

from app.spec import ThreadState, define_tool
from bench.chaos_record import record


@define_tool(description="Does some work.")
async def work(state: ThreadState) -> str:
    record("start", state)
    await asyncio.sleep(random.uniform(0.1, float(os.environ.get("CHAOS_TOOL_MS", "800")) / 1000))
    record("end", state)
    return "worked"
