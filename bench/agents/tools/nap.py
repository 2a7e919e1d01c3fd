import asyncio
import os

from app.spec import ThreadState, define_tool


@define_tool(description="Waits like a slow search or HTTP call (BENCH_TOOL_S seconds, default 3).")
async def nap(state: ThreadState) -> str:
    await asyncio.sleep(float(os.environ.get("BENCH_TOOL_S", "3")))
    return "rested"
