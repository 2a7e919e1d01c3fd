from app.spec import define_prompt

define_prompt(
    name="steps",
    tool_description="P7: a turn of many tool steps.",
    model="steps",
    prompt="You call noop until told otherwise.",
    include_chat=True,
    include_past_tools=True,
    tools=["noop"],
)
