"""The one `Model` contract every provider implements, and the request/response shapes it speaks.

Messages are already in the acting side's perspective (`semantics.md` §1): the engine flips, the provider
adapter only translates to its wire format.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.spec.messages import LLMMessage, ToolCall


@dataclass
class LLMTool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class LLMRequest:
    """What a provider is asked; `respond` functions of the `test` provider receive exactly this."""

    model: str
    messages: list[LLMMessage]
    tools: list[LLMTool] = field(default_factory=list)
    tool_choice: str | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None  # the model's `capabilities.max_output_tokens`, if set


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


@dataclass
class LLMResponse:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    reasoning_details: list[dict[str, Any]] | None = None  # opaque provider blocks, stored for replay
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"  # "stop" | "tool_calls" | "length" | "content_filter" | the provider's own


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class Done:
    response: LLMResponse


StreamEvent = TextDelta | ReasoningDelta | Done


@dataclass(frozen=True)
class CallContext:
    """Where a call is made from: the `test` provider's durable script position is `call_index`;
    `api_key` is the value of the model's `api_key_env`, resolved by the engine (thread env, then process env)."""

    thread_id: str
    call_index: int
    api_key: str | None = None


class ProviderError(Exception):
    """A provider call failed; `retriable` ones may be tried again or fall back.

    `kind`: `auth` (401/403), `bad_request` (other 4xx), `rate_limited` (429), `server` (5xx, 529), `timeout`,
    `connection`, `stream` (a malformed or truncated stream) or `error`. `retry_after` is the provider's
    `Retry-After` in seconds, when it sent one. The message never contains an API key.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retriable: bool = False,
        kind: str = "error",
        retry_after: float | None = None,
        failed_generation: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retriable = retriable
        self.kind = kind
        self.retry_after = retry_after
        self.failed_generation = failed_generation  # the text of a refused tool call (Groq `tool_use_failed`)


class Model(Protocol):
    """A configured model of one provider."""

    provider: str

    def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        """Answer `request`, yielding deltas and finally one `Done`."""
        ...


async def aclose(stream: AsyncIterator[StreamEvent]) -> None:
    """Close a stream left early: an async generator's `finally` (an open HTTP response) runs now, not when the
    garbage collector finds it."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()
