"""Benchmark B4: the real `openai` provider against bench/peers/fake_llm.py (an OpenAI-compatible server with
latency), the same server Aegra's `stream` graph calls through langchain-openai. run.sh exports FAKE_LLM_URL
(`http://127.0.0.1:<port>/v1`); unset (the `chat`/`tool` benchmarks), a closed port: a `stream` run fails at once.
A server of one's own at `base_url` takes no key (docs/authoring.md, `api_key_env`)."""

import os

from app.spec import define_model

define_model(
    name="fakeapi", provider="openai", model="fake", base_url=os.environ.get("FAKE_LLM_URL", "http://127.0.0.1:9/v1")
)
