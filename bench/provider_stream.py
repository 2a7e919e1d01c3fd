"""The `openai` provider's cost per streamed chunk, in process: CPU µs per chunk read, parsed and handed on.

A stream of `--chunks` Chat Completions chunks (a few words of text each, as OpenAI sends them) is served from
memory through httpx (`MockTransport`, no socket), either one chunk per network read — a model slower than the
network, as B4's is — or `--per-read` chunks per read, as a fast model or a busy connection delivers them; the
adapter reads it as the engine does (`OpenAIModel.stream`). The figure is the median of `--runs` runs.

    .venv/bin/python -m bench.provider_stream [--chunks 20000] [--per-read 1] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator

import httpx

from app import llm
from app.llm.base import CallContext, LLMRequest, TextDelta
from app.spec import define_model
from app.spec.messages import LLMMessage


def chunk(i: int) -> bytes:
    delta = {"content": f" word{i} and"}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    body = {"id": "chatcmpl-B9x", "object": "chat.completion.chunk", "created": 1732700000, "model": "gpt-4.1-mini"}
    return f"data: {json.dumps({**body, 'system_fingerprint': 'fp_1', 'choices': [choice]})}\n\n".encode()


class Reads(httpx.AsyncByteStream):
    """The response body, `per_read` chunks per read."""

    def __init__(self, chunks: list[bytes], per_read: int) -> None:
        self._reads = [b"".join(chunks[i : i + per_read]) for i in range(0, len(chunks), per_read)]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for read in self._reads:
            yield read


async def once(chunks: list[bytes], per_read: int) -> tuple[float, int]:
    """CPU seconds to stream it all, and the deltas handed on."""
    stream = Reads(chunks, per_read)
    transport = httpx.MockTransport(
        lambda _: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)
    )
    definition = define_model(name="m", provider="openai", model="gpt-4.1-mini", base_url="http://model.test/v1")
    async with httpx.AsyncClient(transport=transport) as http:
        model = llm.build(definition, http)
        request = LLMRequest(model="gpt-4.1-mini", messages=[LLMMessage("user", "hi")])
        start = time.process_time()
        deltas = 0
        async for event in model.stream(request, CallContext("t", 0)):
            deltas += isinstance(event, TextDelta)
        return time.process_time() - start, deltas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--per-read", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    chunks = [chunk(i) for i in range(args.chunks)]
    chunks.append(b'data: {"id": "chatcmpl-B9x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n')
    chunks.append(b"data: [DONE]\n\n")
    results = [asyncio.run(once(chunks, args.per_read)) for _ in range(args.runs)]
    seconds = statistics.median(r[0] for r in results)
    print(
        f"{args.chunks} chunks, {args.per_read} per read: {seconds / args.chunks * 1e6:.1f} µs of CPU per chunk, "
        f"{results[0][1]} deltas handed on"
    )


if __name__ == "__main__":
    main()
