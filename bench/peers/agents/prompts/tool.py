from app.spec import define_prompt

define_prompt(
    name="tool",
    tool_description="tool",
    model="fake",
    prompt="You answer.",
    include_chat=True,
    include_past_tools=True,
    tools=["lookup"],
)
