from app.spec import define_agent

for name in ("fanout_serial", "fanout_parallel"):
    define_agent(name=name, type="ai_human", side_a={"prompt": name, "stop_on_response": True})
