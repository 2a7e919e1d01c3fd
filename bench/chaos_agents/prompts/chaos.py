from app.spec import define_prompt

for name, tools in (
    ("chaos", ["work", "spin", "chaos_child"]),
    ("chaos_duo_a", ["work"]),
    ("chaos_duo_b", ["work"]),
    ("chaos_helper", ["work"]),
    ("chaos_reviewer", []),
):
    define_prompt(
        name=name,
        model="chaos",
        prompt=name,
        include_chat=True,
        include_past_tools=True,
        tools=tools,
        parallel_tool_calls=name == "chaos",  # its answers of several calls run them at once
    )
