"""The `test` provider: deterministic and offline, from a script or a `respond` function (`authoring.md`)."""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import ValidationError

from app.llm.base import (
    CallContext,
    Done,
    LLMRequest,
    LLMResponse,
    ProviderError,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    Usage,
)
from app.spec.definitions import ModelDefinition, TestReply
from app.spec.messages import ToolCall

RETRIABLE = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


def key_variable(definition: ModelDefinition) -> str | None:
    """The variable the model's API key is read from: only one it names (the provider is offline)."""
    return definition.api_key_env


def required_key(definition: ModelDefinition) -> None:
    """None: the `test` provider is offline and needs no key."""


class TestModel:
    """Answers the n-th call of a thread with script entry n, or with `respond(request)`."""

    provider = "test"
    __test__ = False  # not a pytest test class

    def __init__(self, definition: ModelDefinition, http: httpx.AsyncClient | None = None) -> None:
        self.definition = definition

    async def _reply(self, request: LLMRequest, ctx: CallContext) -> TestReply:
        d = self.definition
        if d.respond is not None:
            raw: Any = d.respond(request)
            if inspect.isawaitable(raw):
                raw = await raw
        elif d.script is not None and ctx.call_index < len(d.script):
            raw = d.script[ctx.call_index]
        else:
            raise ProviderError("test script exhausted", status=400)
        if isinstance(raw, TestReply):
            return raw
        if isinstance(raw, str):
            return TestReply(text=raw)
        try:
            return TestReply.model_validate(raw)
        except ValidationError as exc:
            raise ProviderError(f"test model `{d.name}` gave an invalid reply: {exc}", status=400) from exc

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        d = self.definition
        if d.delay_ms:
            await asyncio.sleep(d.delay_ms / 1000)
        reply = await self._reply(request, ctx)
        if reply.error is not None:
            status = reply.status or 500
            kind = "rate_limited" if status == 429 else "server" if status >= 500 else "bad_request"
            raise ProviderError(reply.error, status=status, retriable=status in RETRIABLE, kind=kind)
        text = reply.text or ""
        size = d.chunk_size or max(len(text), 1)
        if reply.reasoning:
            yield ReasoningDelta(reply.reasoning)
        for start in range(0, len(text), size):
            if start and d.chunk_delay_ms:  # a pause between chunks, so a reader sees the text stream in
                await asyncio.sleep(d.chunk_delay_ms / 1000)
            yield TextDelta(text[start : start + size])
        # ids unique per thread, across its models: by script position, or at random for a `respond` function (the
        # engine counts a thread's requests only for a script)
        prefix = f"call_{d.name}_{ctx.call_index}" if d.respond is None else f"call_{uuid.uuid4().hex[:16]}"
        calls: list[ToolCall] = [
            {
                "id": c.id or f"{prefix}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(reply.tool_calls)
        ]
        usage = reply.usage or {}
        yield Done(
            LLMResponse(
                text=text,
                tool_calls=calls,
                reasoning=reply.reasoning,
                usage=Usage(
                    input_tokens=usage.get("input_tokens", sum(len(m.content or "") for m in request.messages) // 4),
                    output_tokens=usage.get("output_tokens", len(text) // 4),
                    cached_tokens=usage.get("cached_tokens", 0),
                    reasoning_tokens=usage.get("reasoning_tokens", 0),
                ),
                finish_reason="tool_calls" if calls else "stop",
            )
        )
