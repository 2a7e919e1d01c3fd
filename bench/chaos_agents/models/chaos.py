"""The chaos harness's model: thinks for a random short while, then calls one tool per input, then answers.

The first word of the last user message picks the tools: `cpu` → `spin` (blocks the event loop), `child` → the
blocking subagent `chaos_child`, `fan` → three `work` calls in one answer, `kids` → two `chaos_child` calls and a
`work` call in one answer (the `chaos` prompt runs the calls of one answer at once), anything else → `work`. The
child's reviewer approves at once.
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
    has_child = any(t.name == "chaos_child" for t in request.tools)
    if word == "child" and has_child:
        return {"tool_calls": [{"name": "chaos_child", "arguments": {"message": "work"}}]}
    if word == "fan":
        return {"tool_calls": [{"name": "work", "arguments": {}} for _ in range(3)]}
    if word == "kids" and has_child:
        child = {"name": "chaos_child", "arguments": {"message": "work"}}
        return {"tool_calls": [child, child, {"name": "work", "arguments": {}}]}
    return {"tool_calls": [{"name": "work", "arguments": {}}]}


define_model(name="chaos", provider="test", respond=respond)
