"""The soak's models: `soakapi`, the real `openai` provider against bench/peers/fake_llm.py (B4's model: 300 ms to the
first token, 10 chunks 80 ms apart; `SOAK_LLM_URL`, set by bench/soak.py), and `soak_review`, which approves at once."""

import os
from typing import Any

from app.llm.base import LLMRequest
from app.spec import define_model

define_model(
    name="soakapi", provider="openai", model="fake", base_url=os.environ.get("SOAK_LLM_URL", "http://127.0.0.1:9/v1")
)


def approve(request: LLMRequest) -> dict[str, Any]:
    return {"tool_calls": [{"name": "approve", "arguments": {"summary": "approved"}}]}


define_model(name="soak_review", provider="test", respond=approve)
