"""Write a Markdown report of the conversation into the thread's files (`/reports/<slug>.md`)."""

import re

from pydantic import BaseModel, Field

from app.spec import ThreadState, define_tool


class Args(BaseModel):
    title: str = Field(description="The report's title", min_length=1, max_length=120)


@define_tool(description="Write a Markdown report of this conversation to the thread's files and return its path.")
async def write_report(state: ThreadState, args: Args) -> str:
    page = await state.get_messages(limit=500)
    lines = [f"# {args.title}", ""]
    for message in page.messages:
        if message.role in ("user", "assistant") and message.content:
            lines.append(f"- **{message.role}**: {message.content}")
    slug = re.sub(r"[^a-z0-9]+", "-", args.title.lower()).strip("-") or "report"
    record = await state.write_file(f"/reports/{slug}.md", "\n".join(lines) + "\n", "text/markdown")
    return f"{record.path} ({record.size} bytes)"
