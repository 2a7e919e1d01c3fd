from app.spec import define_prompt

# `soak` calls what the user message names (fake_llm.py: `call:<tool>,…`), by default three `work` calls at once
define_prompt(
    name="soak",
    model="soakapi",
    prompt="You answer.",
    include_chat=True,
    include_past_tools=True,
    tools=["work", "soak_child", "keep_file", "later"],
    parallel_tool_calls=True,
)
define_prompt(
    name="soak_helper", model="soakapi", prompt="You help.", include_chat=True, tools=["work"], parallel_tool_calls=True
)
define_prompt(name="soak_reviewer", model="soak_review", prompt="You review.", include_chat=True)
