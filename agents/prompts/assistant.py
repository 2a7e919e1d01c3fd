from app.spec import define_prompt

define_prompt(
    name="assistant",
    tool_description="A helpful assistant with a calculator, a clock, reports and reminders.",
    model="demo",
    prompt=[
        {"type": "text", "content": "You are a concise, helpful assistant. "},
        {"type": "text", "content": "Use `calculate` for arithmetic and `get_time` for the current time. "},
        {"type": "text", "content": "Use `write_report` when asked for a report of the conversation. "},
        {"type": "text", "content": "Use `set_reminder` when the user asks to be reminded of something later."},
    ],
    include_chat=True,
    include_past_tools=True,
    tools=["calculate", "get_time", "write_report", "set_reminder"],
)
