from app.spec import define_prompt

define_prompt(
    name="assistant",
    tool_description="A helpful assistant with a calculator, a clock and a report writer.",
    model="demo",
    prompt=[
        {"type": "text", "content": "You are a concise, helpful assistant. "},
        {"type": "text", "content": "Use `calculate` for arithmetic and `get_time` for the current time. "},
        {"type": "text", "content": "Use `write_report` when asked for a report of the conversation."},
    ],
    include_chat=True,
    include_past_tools=True,
    tools=["calculate", "get_time", "write_report"],
)
