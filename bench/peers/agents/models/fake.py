"""The `chat` and `tool` agents' model: zero latency, deterministic, the same behaviour as the Aegra graphs'
FakeChatModel (bench/peers/aegra/graph.py)."""

from typing import Any

from app.llm.base import LLMRequest
from app.spec import define_model

REPLY = "pong: the deterministic fake model answered."


def respond(request: LLMRequest) -> dict[str, Any]:
    last = request.messages[-1]
    if request.tools and last.role == "user":
        return {"tool_calls": [{"name": "lookup", "arguments": {"q": "answer"}}]}
    return {"text": REPLY}


define_model(name="fake", provider="test", respond=respond)
