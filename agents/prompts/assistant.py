from app.spec import define_prompt

define_prompt(
    name="assistant",
    tool_description="A helpful assistant with a calculator and a clock.",
    model="demo",
    prompt=[
        {"type": "text", "content": "You are a concise, helpful assistant. "},
        {"type": "text", "content": "Use `calculate` for arithmetic and `get_time` for the current time."},
    ],
    include_chat=True,
    include_past_tools=True,
    tools=["calculate", "get_time"],
)
