"""Write a draft into the thread's files (`/drafts/launch.md`)."""

from pydantic import BaseModel, Field

from app.spec import ThreadState, define_tool


class Args(BaseModel):
    text: str = Field(description="The draft, in Markdown", max_length=20_000)


@define_tool(description="Write the draft to /drafts/launch.md and return its path.")
async def write_draft(state: ThreadState, args: Args) -> str:
    record = await state.write_file("/drafts/launch.md", args.text, "text/markdown")
    return record.path
