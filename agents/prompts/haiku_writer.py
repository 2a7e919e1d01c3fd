from app.spec import define_prompt

define_prompt(
    name="haiku_writer",
    tool_description="Writes a haiku and revises it on feedback.",
    model="haiku_writer",
    prompt="You write haiku: three lines, 5-7-5 syllables. Revise your draft when the reviewer asks.",
    include_chat=True,
    include_past_tools=True,
)
