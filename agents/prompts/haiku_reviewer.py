from app.spec import define_prompt

define_prompt(
    name="haiku_reviewer",
    tool_description="Reviews haiku drafts.",
    model="haiku_reviewer",
    prompt=(
        "You review haiku drafts. Call `approve` with the final poem when it has three lines; ask for a revision "
        "otherwise; call `reject` with a reason when the task cannot be done."
    ),
    include_chat=True,
    include_past_tools=True,
)
