"""Schedule a reminder: the `remind` effect, due after a delay (it survives restarts)."""

from pydantic import BaseModel, Field

from app.spec import ThreadState, define_tool


class Args(BaseModel):
    text: str = Field(description="What to remind the user of")
    delay_seconds: float = Field(ge=0, le=86_400 * 365, description="How many seconds from now")


@define_tool(description="Remind the user of something after a delay, in seconds.")
async def set_reminder(state: ThreadState, args: Args) -> str:
    await state.schedule_effect("remind", {"text": args.text}, delay_ms=args.delay_seconds * 1000)
    return f"Reminder set: in {args.delay_seconds:g} s I will remind the user to {args.text}"
