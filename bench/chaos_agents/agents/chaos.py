from app.spec import define_agent

define_agent(name="chaos", type="ai_human", side_a={"prompt": "chaos", "stop_on_response": True, "max_steps": 6})
define_agent(
    name="chaos_duo",
    type="dual_ai",
    max_session_turns=4,
    side_a={"prompt": "chaos_duo_a", "stop_on_response": True, "max_steps": 4},
    side_b={"prompt": "chaos_duo_b", "stop_on_response": True, "max_steps": 4},
)
define_agent(  # a blocking subagent: its side A works, its side B approves, which ends its session
    name="chaos_child",
    type="dual_ai",
    expose_as_tool=True,
    tool_description="Does a piece of work and reports back.",
    max_session_turns=4,
    side_a={"prompt": "chaos_helper", "stop_on_response": True, "max_steps": 4},
    side_b={"prompt": "chaos_reviewer", "session_stop": {"name": "approve", "message_property": "summary"}},
)
