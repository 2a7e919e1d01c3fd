from app.spec import define_prompt

# `parallel_tool_calls=True`: the fake model then asks for 3 calls of `lookup_slow` in one answer (with `false` it
# would ask for one, as a real model would)
define_prompt(
    name="stream",
    tool_description="stream",
    model="fakeapi",
    prompt="You answer.",
    include_chat=True,
    include_past_tools=True,
    parallel_tool_calls=True,
    tools=["lookup_slow"],
)
