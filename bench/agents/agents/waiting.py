from app.spec import define_agent

define_agent(name="waiting", type="ai_human", side_a={"prompt": "waiting", "stop_on_response": True})
