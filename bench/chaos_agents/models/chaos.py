"""The chaos harness's model: thinks for a random short while, then calls one tool per input, then answers.

The first word of the last user message picks the tool: `cpu` → `spin` (blocks the event loop), `child` → the
blocking subagent `chaos_child`, anything else → `work`. The child's reviewer approves at once.
`CHAOS_MODEL_MS` bounds the thinking time.
"""

import asyncio
import os
import random
from typing import Any

from app.llm.base import LLMRequest
from app.spec import define_model


async def respond(request: LLMRequest) -> dict[str, Any]:
    await asyncio.sleep(random.uniform(0, float(os.environ.get("CHAOS_MODEL_MS", "200")) / 1000))
    if request.messages[0].content == "chaos_reviewer":
        return {"tool_calls": [{"name": "approve", "arguments": {"summary": "approved"}}]}
    conversation = [m for m in request.messages if m.role != "system"]
    last = conversation[-1] if conversation else None
    if last is None or last.role == "tool":
        return {"text": f"done: {last.content if last else ''}"}
    word = (last.content or "").split(" ", 1)[0]
    if word == "cpu":
        return {"tool_calls": [{"name": "spin", "arguments": {}}]}
    if word == "child" and any(t.name == "chaos_child" for t in request.tools):
        return {"tool_calls": [{"name": "chaos_child", "arguments": {"message": "work"}}]}
    return {"tool_calls": [{"name": "work", "arguments": {}}]}


define_model(name="chaos", provider="test", respond=respond)
