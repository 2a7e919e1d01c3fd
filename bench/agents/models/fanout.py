"""The parallel-tools benchmark's model: asks for BENCH_CALLS (default 2) `nap` calls in one answer, then says done."""

import os
from typing import Any

from app.llm.base import LLMRequest
from app.spec import define_model


def respond(request: LLMRequest) -> dict[str, Any]:
    if request.messages[-1].role == "tool":
        return {"text": "done"}
    return {"tool_calls": [{"name": "nap", "arguments": {}} for _ in range(int(os.environ.get("BENCH_CALLS", "2")))]}


define_model(name="fanout", provider="test", respond=respond)
