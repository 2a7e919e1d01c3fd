"""The parallel-tools benchmark's model: asks for BENCH_CALLS (default 2) `nap` calls in one answer, then says done;
with BENCH_CHUNK_MS set, "done" is a 10-chunk reply streamed that many ms apart (`bench/statements.py --b4`)."""

import os
from typing import Any

from app.llm.base import LLMRequest
from app.spec import define_model


def respond(request: LLMRequest) -> dict[str, Any]:
    if request.messages[-1].role == "tool":
        return {"text": "done" if not CHUNK_MS else "d-o-n-e-!!"}
    return {"tool_calls": [{"name": "nap", "arguments": {}} for _ in range(int(os.environ.get("BENCH_CALLS", "2")))]}


CHUNK_MS = int(os.environ.get("BENCH_CHUNK_MS", "0"))
define_model(
    name="fanout", provider="test", respond=respond, chunk_size=1 if CHUNK_MS else None, chunk_delay_ms=CHUNK_MS
)
