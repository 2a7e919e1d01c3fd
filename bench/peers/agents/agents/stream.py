from app.spec import define_agent

# Benchmark B4 (bench/peers/README.md): the real `openai` provider against bench/peers/fake_llm.py
define_agent(name="stream", type="ai_human", side_a={"prompt": "stream", "stop_on_response": True, "max_steps": 4})
