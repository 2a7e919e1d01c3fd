"""Writes a 2 KB note into the thread's files (a file a user keeps); recorded like `work`."""

from app.spec import ThreadState, define_tool
from bench.chaos_record import record


@define_tool(description="Keeps a note in the thread's files.")
async def keep_file(state: ThreadState) -> str:
    record("start", state)
    assert state.execution is not None
    path = f"/notes/{state.execution.tool_call_id}.txt"
    await state.write_file(path, ("note " * 410)[:2048], "text/plain")
    record("end", state)
    return path
