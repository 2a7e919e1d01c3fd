from app.spec import define_agent

define_agent(
    name="assistant",
    type="ai_human",
    title="Assistant",
    description="A helpful assistant with a calculator and a clock, on the offline demo model.",
    side_a={"label": "Assistant", "prompt": "assistant", "stop_on_response": True, "max_steps": 8},
)
