"""The current time in UTC."""

from datetime import UTC, datetime

from app.spec import ThreadState, define_tool


@define_tool(description="The current date and time in UTC (ISO-8601).")
async def get_time(state: ThreadState) -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
