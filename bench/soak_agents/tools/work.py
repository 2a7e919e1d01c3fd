"""Waits like a slow lookup (`SOAK_TOOL_S`, default 0.5 s, as B4's `lookup_slow`); records each execution's start
and end for the chaos invariants (`CHAOS_DIR`, bench/chaos_record.py)."""

import asyncio
import os

from app.spec import ThreadState, define_tool
from bench.chaos_record import record


@define_tool(description="Does some work.")
async def work(state: ThreadState) -> str:
    record("start", state)
    await asyncio.sleep(float(os.environ.get("SOAK_TOOL_S", "0.5")))
    record("end", state)
    return "worked"
