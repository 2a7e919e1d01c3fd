from app.spec import define_agent

define_agent(name="bench", type="ai_human", side_a={"prompt": "bench", "stop_on_response": True})
