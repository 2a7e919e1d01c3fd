"""The benchmarks' model: the `test` provider, answering at once (BENCH_DELAY_MS models LLM latency)."""

import os

from app.spec import define_model

define_model(
    name="bench",
    provider="test",
    respond=lambda request: {"text": "ok"},
    delay_ms=int(os.environ.get("BENCH_DELAY_MS", "0")),
)
