from app.spec import define_agent

define_agent(name="steps", type="ai_human", side_a={"prompt": "steps", "stop_on_response": True, "max_steps": 100})
