from app.spec import define_agent

# the soak's user-facing agent: each user message is one turn of tool calls on the B4 model, then an answer
define_agent(name="soak", type="ai_human", side_a={"prompt": "soak", "stop_on_response": True, "max_steps": 6})
define_agent(  # a blocking subagent: side A works on the B4 model, side B approves at once (the `test` provider)
    name="soak_child",
    type="dual_ai",
    expose_as_tool=True,
    tool_description="Does a piece of work and reports back.",
    max_session_turns=4,
    side_a={"prompt": "soak_helper", "stop_on_response": True, "max_steps": 4},
    side_b={"prompt": "soak_reviewer", "session_stop": {"name": "approve", "message_property": "summary"}},
)
