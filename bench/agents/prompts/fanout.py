from app.spec import define_prompt

for name, parallel in (("fanout_serial", False), ("fanout_parallel", True)):
    define_prompt(
        name=name,
        tool_description="The parallel-tools benchmark's prompt.",
        model="fanout",
        prompt="You call your tools.",
        include_chat=True,
        include_past_tools=True,
        tools=["nap"],
        parallel_tool_calls=parallel,
    )
