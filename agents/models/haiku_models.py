"""Offline models for the `haiku_review` dual_ai example: a writer and a reviewer on the `test` provider.

The writer drafts a haiku about the topic it was given and revises it when the reviewer asks; the reviewer
approves a three-line draft (its `sessionStop` tool), asks for a revision otherwise, and gives up (its
`sessionFail` tool) when the task cannot be done. `AGENTS_PROVIDER` switches both to a real model, as for the demo.
"""

import os

from app.spec import define_model


def _topic(request):
    task = next((m.content for m in request.messages if m.role != "system" and m.content), "") or ""
    return task.rsplit(" about ", 1)[-1].strip(" .?!") if " about " in task else "the sea"


def write(request):
    topic = _topic(request)
    feedback = request.messages[-1].content or ""
    if "three lines" in feedback:
        return {"text": f"Over {topic}, light\nfolds into the waiting hush\none breath, then the tide"}
    return {"text": f"Over {topic}, light\nfolds into the waiting hush"}


def review(request):
    draft = request.messages[-1].content or ""
    if "impossible" in _topic(request).lower():
        return {"tool_calls": [{"name": "reject", "arguments": {"reason": "The topic cannot be written about."}}]}
    lines = [line for line in draft.splitlines() if line.strip()]
    if len(lines) == 3:
        return {"tool_calls": [{"name": "approve", "arguments": {"verdict": draft}}]}
    return {"text": f"The draft has {len(lines)} line(s); a haiku needs three lines. Please revise."}


def configured(**offline):
    provider = os.environ.get("AGENTS_PROVIDER", "test")
    model = os.environ.get("AGENTS_MODEL") or {"openai": "gpt-4.1-mini", "anthropic": "claude-sonnet-4-5"}.get(provider)
    live = {"model": model, "base_url": os.environ.get("AGENTS_BASE_URL") or None}
    return {"provider": "test", **offline} if provider == "test" else {"provider": provider, **live}


define_model(name="haiku_writer", **configured(respond=write, chunk_size=8))
define_model(name="haiku_reviewer", **configured(respond=review, chunk_size=8))
