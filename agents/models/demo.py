"""An offline model for the demo: the `test` provider with a small `respond` function.

It calls `calculate` for arithmetic, `get_time` when asked the time, and answers tool results in words.
Swap `provider="test"` for a real provider once one is configured.
"""

import re

from app.spec import define_model

ARITHMETIC = re.compile(r"[-+*/().\d\s]*\d\s*[-+*/]\s*[-+*/().\d\s]+")


def respond(request):
    last = request.messages[-1]
    if last.role == "tool":
        return {"text": f"The answer is {last.content}."}
    text = last.content or ""
    match = ARITHMETIC.search(text)
    if match:
        return {"tool_calls": [{"name": "calculate", "arguments": {"expression": match.group().strip()}}]}
    if "time" in text.lower():
        return {"tool_calls": [{"name": "get_time", "arguments": {}}]}
    return {
        "text": "I am the demo assistant on the offline `test` model. "
        "Ask me to calculate something like 2 + 2 * 3, or ask me for the time."
    }


define_model(name="demo", provider="test", respond=respond, chunk_size=8)
