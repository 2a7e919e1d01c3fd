from app.spec import ThreadState, define_tool


@define_tool(description="Does nothing, at once.")
async def noop(state: ThreadState) -> str:
    return "done"
