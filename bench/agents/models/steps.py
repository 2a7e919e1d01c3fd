"""P7's model: answers at once; a user message `steps N` makes the turn call `noop` N times, anything else ends it."""

from typing import Any

from app.llm.base import LLMRequest
from app.spec import define_model


def respond(request: LLMRequest) -> dict[str, Any]:
    called = 0
    for message in reversed(request.messages):
        if message.role == "user":
            words = (message.content or "").split()
            wanted = int(words[1]) if len(words) == 2 and words[0] == "steps" else 0
            return {"tool_calls": [{"name": "noop", "arguments": {}}]} if called < wanted else {"text": "ok"}
        if message.role == "tool":
            called += 1
    return {"text": "ok"}


define_model(name="steps", provider="test", respond=respond)
