from app.spec import define_prompt

define_prompt(
    name="waiting",
    tool_description="bench/inflight.py's prompt: a turn that waits on a slow model.",
    model="waiting",
    prompt="You answer.",
    include_chat=True,
)
