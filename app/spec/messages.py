"""The messages a model is sent, as the authoring surface exposes them (`prefilter_llm_history` hooks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict


class FunctionCall(TypedDict):
    name: str
    arguments: str


class ToolCall(TypedDict):
    """A tool call in the OpenAI shape the spec's `Message.tool_calls` uses."""

    id: str
    type: Literal["function"]
    function: FunctionCall


@dataclass
class LLMImage:
    """An image in a user message: base64 `data` (no `data:` prefix) with its mime type, or a `url`."""

    mime_type: str
    data: str | None = None
    url: str | None = None
    path: str | None = None  # a file of the thread, read into `data` by the engine before the request is sent


@dataclass
class LLMMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    images: list[LLMImage] = field(default_factory=list)
    # replayed on assistant messages, only to the prompt that produced them: the text of the model's reasoning
    # and the provider's opaque reasoning blocks (OpenRouter `reasoning_details`, Anthropic thinking blocks with
    # their signatures), exactly as the provider returned them
    reasoning: str | None = None
    reasoning_details: list[dict[str, Any]] | None = None
