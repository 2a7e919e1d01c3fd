"""The demo assistant's model: offline by default, a real one when `AGENTS_PROVIDER` is set.

Offline it is the `test` provider with a small `respond` function: it calls `calculate` for arithmetic, `get_time`
when asked the time, `write_report` when asked for a report, `set_reminder` for "remind me in N seconds to ...",
answers tool results and reminders in words, and shows a Markdown sample when asked for code or Markdown. With
`AGENTS_PROVIDER=openai|anthropic` (and optionally `AGENTS_MODEL`, `AGENTS_BASE_URL`) it is that provider's model; the
key comes from `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` (see the README).
"""

import os
import re

from app.spec import define_model

OPERATOR = re.compile(r"\d[ \t]*[-+*/][ \t]*[-(.\d]")  # a digit, an operator, then an operand
ARITHMETIC_CHARS = frozenset("-+*/(). \t0123456789")
REMIND = re.compile(r"remind me in (\d+(?:\.\d+)?) seconds? to (.+)", re.IGNORECASE)


def respond(request):
    last = request.messages[-1]
    if last.role == "tool" and last.name == "write_report":
        return {"text": f"I wrote the report to {last.content}."}
    if last.role == "tool":
        if str(last.content or "").startswith("Reminder set"):
            return {"text": "Done: I will remind you."}
        return {"text": f"The answer is {last.content}."}
    text = last.content or ""
    if text.startswith("Reminder: "):
        return {"text": f"Here is your reminder: {text.removeprefix('Reminder: ')}"}
    reminder = REMIND.search(text)
    if reminder:
        arguments = {"text": reminder.group(2).strip().rstrip("."), "delay_seconds": float(reminder.group(1))}
        return {"tool_calls": [{"name": "set_reminder", "arguments": arguments}]}
    if "report" in text.lower():
        return {"tool_calls": [{"name": "write_report", "arguments": {"title": "Conversation report"}}]}
    expression = arithmetic(text)
    if expression:
        return {"tool_calls": [{"name": "calculate", "arguments": {"expression": expression}}]}
    if "time" in text.lower():
        return {"tool_calls": [{"name": "get_time", "arguments": {}}]}
    if "code" in text.lower() or "markdown" in text.lower():
        return {"text": SAMPLE}
    return {
        "text": "I am the demo assistant on the offline `test` model. "
        "Ask me to calculate something like 2 + 2 * 3, ask me for the time, or ask for a report."
    }


SAMPLE = """Here is **Markdown** with some `inline code`:

- a list item
- another one

```python
def greet(name):
    # say hello
    return f"Hello, {name}!" * 2
```
"""


def arithmetic(text):
    """The first stretch of arithmetic in `text` ("12 * (3 + 4)"), found in linear time: the run of arithmetic
    characters around the first digit-operator-operand (one regex over the whole run would backtrack on long
    digit runs)."""
    found = OPERATOR.search(text)
    if found is None:
        return None
    start, end = found.start(), found.end()
    while start > 0 and text[start - 1] in ARITHMETIC_CHARS:
        start -= 1
    while end < len(text) and text[end] in ARITHMETIC_CHARS:
        end += 1
    return text[start:end].strip()


DEFAULT_MODEL = {"openai": "gpt-4.1-mini", "anthropic": "claude-sonnet-4-5"}


def configured(**offline):
    """The model's fields: `offline` unless `AGENTS_PROVIDER` names a real provider."""
    provider = os.environ.get("AGENTS_PROVIDER", "test")
    if provider == "test":
        return {"provider": "test", **offline}
    model = os.environ.get("AGENTS_MODEL") or DEFAULT_MODEL.get(provider)
    return {"provider": provider, "model": model, "base_url": os.environ.get("AGENTS_BASE_URL") or None}


# offline, the reply streams in 8-character chunks 50 ms apart (a longer reply over most of a second), as a real model
define_model(name="demo", **configured(respond=respond, chunk_size=8, chunk_delay_ms=50))
