from app.spec import define_prompt

define_prompt(
    name="bench",
    tool_description="The benchmarks' prompt.",
    model="bench",
    prompt="You answer ok.",
    include_chat=True,
)
