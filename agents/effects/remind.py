"""Remind the user: queue a message that wakes the thread, so the assistant answers it. The runtime marks a message an
effect queues as the effect's (`metadata`: `source: effect`, `effect: remind`), so a client (the playground) draws it
as the effect's, not as the user's."""

from pydantic import BaseModel, Field

from app.spec import ThreadState, define_effect


class RemindArgs(BaseModel):
    text: str = Field(description="What to remind the user of")


@define_effect(description="Send the user a reminder.")
async def remind(state: ThreadState, args: RemindArgs) -> None:
    await state.queue_message("user", f"Reminder: {args.text}")
