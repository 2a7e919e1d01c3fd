"""`bench/inflight.py`'s model: the real `openai` provider against the slow OpenAI-compatible server it starts
(`bench/peers/fake_llm.py`) at `BENCH_LLM_URL`; unset, a closed port (a call fails at once)."""

import os

from app.spec import define_model

define_model(
    name="waiting", provider="openai", model="fake", base_url=os.environ.get("BENCH_LLM_URL", "http://127.0.0.1:9/v1")
)
