"""Benchmark B4: a tool with latency, as Aegra's `lookup_slow` (bench/peers/aegra/graph.py): 0.5 s (asyncio), "42".
Its own name because a tool is named by its file and `lookup` (instant) serves the `tool` agent; fake_llm.py calls
`lookup_slow` (--tool-name)."""

import asyncio

from pydantic import BaseModel

from app.spec import ThreadState, define_tool


class Args(BaseModel):
    q: str


@define_tool(description="Look a fact up (slowly).")
async def lookup_slow(state: ThreadState, args: Args) -> str:
    await asyncio.sleep(0.5)
    return "42"
