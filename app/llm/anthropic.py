"""The `anthropic` provider: Anthropic's Messages API, streamed over the engine's shared HTTP client.

Wire format: https://docs.anthropic.com/en/api/messages-streaming and
https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from app import masking
from app.llm import sse, transport
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
from app.spec.definitions import ModelDefinition
from app.spec.messages import LLMMessage, ToolCall

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_KEY_ENV = "ANTHROPIC_API_KEY"
# `max_tokens` is required by the API: the model's `max_output_tokens`, else this (every current Claude model
# allows at least 8192 output tokens); with thinking on and no cap set, the budget is added on top of it
DEFAULT_MAX_TOKENS = 8192
MIN_THINKING_BUDGET = 1024  # the API's floor for `budget_tokens`
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}  # `reasoning.effort` → budget
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}
# in-stream `error` event types → (kind, status, retriable); https://docs.anthropic.com/en/api/errors
STREAM_ERRORS: dict[str, tuple[str, int | None, bool]] = {
    "invalid_request_error": ("bad_request", 400, False),
    "authentication_error": ("auth", 401, False),
    "permission_error": ("auth", 403, False),
    "not_found_error": ("bad_request", 404, False),
    "request_too_large": ("bad_request", 413, False),
    "rate_limit_error": ("rate_limited", 429, True),
    "api_error": ("server", 500, True),
    "overloaded_error": ("server", 529, True),
}
REPLAYED = {"thinking": "signature", "redacted_thinking": "data"}  # replayable block types and their opaque field
STREAMED_FIELDS = ("text", "thinking", "signature", "partial_json")  # a block's fields its deltas add to


def fold(messages: list[LLMMessage]) -> tuple[str | None, list[dict[str, Any]]]:
    """The `system` prompt and the alternating `messages` (`semantics.md` §4): the first system message is the
    system prompt, later ones user text prefixed `[system] `, and consecutive messages of one role merge."""
    system: str | None = None
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system" and system is None:
            system = message.content or ""
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for entry in out:
        # the API wants tool results first in a user turn and thinking first in an assistant turn
        first = ("tool_result",) if entry["role"] == "user" else tuple(REPLAYED)
        entry["content"].sort(key=lambda block: block["type"] not in first)
    return system or None, out


def _text(text: str | None) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []  # the API rejects empty text blocks


def _blocks(message: LLMMessage) -> list[dict[str, Any]]:
    """One message's content blocks."""
    if message.role == "system":
        return _text(f"[system] {message.content or ''}")
    if message.role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        if message.content:
            result["content"] = message.content
        return [result]
    if message.role == "user":
        images = [
            {"type": "image", "source": {"type": "url", "url": image.url}}
            if image.url
            else {"type": "image", "source": {"type": "base64", "media_type": image.mime_type, "data": image.data}}
            for image in message.images
        ]
        return images + _text(message.content)
    replayed = [
        block
        for block in message.reasoning_details or []
        if block.get("type") in REPLAYED and block.get(REPLAYED[block["type"]])  # not another provider's details
    ]
    calls = [
        {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": _input(call)}
        for call in message.tool_calls or []
    ]
    return replayed + _text(message.content) + calls


def _input(call: ToolCall) -> dict[str, Any]:
    """A tool call's arguments as the object `tool_use.input` must be (`{}` when they do not parse)."""
    try:
        value = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _thinking(reasoning: dict[str, Any] | None, max_tokens: int | None) -> int | None:
    """The thinking budget for a `reasoning` config (`ReasoningConfig`), or None when thinking is off."""
    if reasoning is None or reasoning.get("enabled") is False:
        return None
    if reasoning.get("max_tokens"):
        budget = int(reasoning["max_tokens"])
    else:
        budget = THINKING_BUDGETS.get(reasoning.get("effort") or "medium", THINKING_BUDGETS["medium"])
    if max_tokens is not None and budget >= max_tokens:
        budget = max_tokens // 2  # an explicit output cap wins; the answer keeps half of it
    return max(budget, MIN_THINKING_BUDGET)


def _tool_choice(request: LLMRequest) -> dict[str, Any] | None:
    """`tool_choice`: auto / none / required → any / a tool's name → that tool; None leaves the API's default."""
    choice: dict[str, Any]
    if request.tool_choice == "none":
        return {"type": "none"}
    if request.tool_choice in (None, "auto"):
        choice = {"type": "auto"}
    elif request.tool_choice == "required":
        choice = {"type": "any"}
    else:
        choice = {"type": "tool", "name": request.tool_choice}
    if request.parallel_tool_calls is False:
        choice["disable_parallel_tool_use"] = True
    elif request.tool_choice is None:
        return None
    return choice


def body(request: LLMRequest, definition: ModelDefinition) -> dict[str, Any]:
    """The JSON body of `POST /v1/messages` for a request."""
    cap = request.max_tokens or definition.capabilities.max_output_tokens
    system, messages = fold(request.messages)
    budget = _thinking(request.reasoning, cap)
    out: dict[str, Any] = {
        "model": request.model,
        "max_tokens": cap or (DEFAULT_MAX_TOKENS + (budget or 0)),
        "messages": messages,
        "stream": True,
    }
    if system:
        out["system"] = system
    if request.tools:
        out["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
        ]
        choice = _tool_choice(request)
        if choice is not None:
            out["tool_choice"] = choice
    if budget is not None:
        out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    out.update(request.provider_options)
    return out


class _Assembly:
    """The response being streamed: content blocks by index, usage and stop reason."""

    def __init__(self, show_reasoning: bool) -> None:
        self.show_reasoning = show_reasoning
        self.blocks: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, int] = {}
        self.stop_reason: str | None = None
        self.stopped = False

    def feed(self, event: dict[str, Any]) -> StreamEvent | None:
        """Take one event; the delta to pass on, if any."""
        kind = event.get("type")
        if kind == "message_start":
            self._usage(event["message"].get("usage"))
        elif kind == "content_block_start":
            block = dict(event["content_block"])
            for field in STREAMED_FIELDS:  # their pieces, joined once at the end (`response`)
                block[field] = [block[field]] if isinstance(block.get(field), str) else []
            self.blocks[event["index"]] = block
            return self._delta(block["type"], "".join(block["text"]) or "".join(block["thinking"]))
        elif kind == "content_block_delta":
            return self._apply(self.blocks[event["index"]], event["delta"])
        elif kind == "message_delta":
            self.stop_reason = event["delta"].get("stop_reason") or self.stop_reason
            self._usage(event.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            error = event.get("error") or {}
            kind_, status, retriable = STREAM_ERRORS.get(str(error.get("type")), ("stream", None, True))
            raise ProviderError(
                f"anthropic: {error.get('type', 'error')}: {error.get('message', '')}",
                status=status,
                retriable=retriable,
                kind=kind_,
            )
        return None  # ping, content_block_stop and event types added later

    def _apply(self, block: dict[str, Any], delta: dict[str, Any]) -> StreamEvent | None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"].append(delta["text"])
            return self._delta("text", delta["text"])
        if kind == "thinking_delta":
            block["thinking"].append(delta["thinking"])
            return self._delta("thinking", delta["thinking"])
        if kind == "signature_delta":
            block["signature"].append(delta["signature"])
        elif kind == "input_json_delta":
            block["partial_json"].append(delta.get("partial_json", ""))
        return None

    def _delta(self, kind: str, text: str) -> StreamEvent | None:
        if not text:
            return None
        if kind == "text":
            return TextDelta(text)
        if kind == "thinking" and self.show_reasoning:
            return ReasoningDelta(text)
        return None

    def _usage(self, usage: dict[str, Any] | None) -> None:
        # message_delta's counts are cumulative, so a later value replaces an earlier one
        self.usage.update({k: v for k, v in (usage or {}).items() if isinstance(v, int)})

    def response(self) -> LLMResponse:
        text: list[str] = []
        thinking: list[str] = []
        details: list[dict[str, Any]] = []
        calls: list[ToolCall] = []
        for _, block in sorted(self.blocks.items()):
            kind = block["type"]
            if kind == "text":
                text.append("".join(block["text"]))
            elif kind == "thinking":
                thinking.append("".join(block["thinking"]))
                details.append({"type": "thinking", "thinking": thinking[-1], "signature": "".join(block["signature"])})
            elif kind == "redacted_thinking":
                details.append({"type": "redacted_thinking", "data": block.get("data", "")})
            elif kind == "tool_use":
                arguments = "".join(block["partial_json"]) or json.dumps(block.get("input") or {})
                calls.append(
                    {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
                )
        u = self.usage
        cache_read = u.get("cache_read_input_tokens", 0)
        stop = self.stop_reason or "end_turn"
        return LLMResponse(
            text="".join(text),
            tool_calls=calls,
            reasoning=("".join(thinking) or None) if self.show_reasoning else None,
            reasoning_details=details or None,
            usage=Usage(
                input_tokens=u.get("input_tokens", 0) + cache_read + u.get("cache_creation_input_tokens", 0),
                output_tokens=u.get("output_tokens", 0),
                cached_tokens=cache_read,
            ),
            finish_reason=STOP_REASONS.get(stop, stop),
        )


def _event(data: str) -> dict[str, Any]:
    """The JSON `data` of one server-sent event (the `event:` line repeats the data's `type`)."""
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise ProviderError("anthropic: malformed stream event", kind="stream", retriable=True) from exc
    if not isinstance(event, dict):
        raise ProviderError("anthropic: malformed stream event", kind="stream", retriable=True)
    return event


def retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds: a number of seconds or an HTTP date."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _http_error(response: httpx.Response, key_env: str, key: str) -> ProviderError:
    status = response.status_code
    try:
        message = str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = response.text[:500] or response.reason_phrase
    message = masking.scrub(message, [key])  # in case the API ever echoes what it was sent
    if status in (401, 403):
        return ProviderError(
            f"anthropic rejected the API key in `{key_env}` ({status}): {message}", status=status, kind="auth"
        )
    if status == 429:
        return ProviderError(
            f"anthropic: rate limited: {message}",
            status=status,
            retriable=True,
            kind="rate_limited",
            retry_after=retry_after(response),
        )
    if status >= 500:  # 529 is `overloaded_error`
        return ProviderError(
            f"anthropic: server error {status}: {message}",
            status=status,
            retriable=True,
            kind="server",
            retry_after=retry_after(response),
        )
    return ProviderError(f"anthropic: {status}: {message}", status=status, kind="bad_request")


def key_variable(definition: ModelDefinition) -> str:
    """The variable the model's API key is read from."""
    return definition.api_key_env or DEFAULT_KEY_ENV


def required_key(definition: ModelDefinition) -> str:
    """The variable the model cannot be called without: Anthropic's API always takes a key."""
    return key_variable(definition)


class AnthropicModel:
    """A Claude model behind the `Model` contract."""

    provider = "anthropic"

    def __init__(self, definition: ModelDefinition, http: httpx.AsyncClient) -> None:
        self.definition = definition
        self.http = http
        self.url = (definition.base_url or DEFAULT_BASE_URL).rstrip("/") + "/v1/messages"
        self.key_env = required_key(definition)

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        if not ctx.api_key:
            raise ProviderError(f"anthropic: no API key: set `{self.key_env}`", kind="auth")
        headers = {"x-api-key": ctx.api_key, "anthropic-version": API_VERSION, "accept": "text/event-stream"}
        reasoning = request.reasoning or {}
        assembly = _Assembly(show_reasoning=not reasoning.get("exclude") and reasoning.get("include") is not False)
        try:
            async with transport.streamed(
                self.http, "POST", self.url, json=body(request, self.definition), headers=headers
            ) as r:
                if r.status_code >= 400:
                    await r.aread()
                    raise _http_error(r, self.key_env, ctx.api_key)
                reads = sse.batches(r)
                async for found in reads:  # what one read completed, its deltas merged
                    deltas: list[StreamEvent] = []
                    for data in found:
                        event = _event(data)
                        try:
                            delta = assembly.feed(event)
                        except (KeyError, TypeError, AttributeError) as exc:
                            raise ProviderError(
                                f"anthropic: malformed stream event {event.get('type')!r}",
                                kind="stream",
                                retriable=True,
                            ) from exc
                        if isinstance(delta, TextDelta | ReasoningDelta):
                            sse.merge(deltas, type(delta), delta.text)
                        if assembly.stopped:
                            break
                    for delta in deltas:
                        yield delta
                    if assembly.stopped:
                        await sse.rest(reads)
                        break
        except httpx.TimeoutException as exc:
            raise ProviderError(f"anthropic: timed out ({type(exc).__name__})", kind="timeout", retriable=True) from exc
        except httpx.TransportError as exc:
            raise ProviderError(f"anthropic: connection failed: {exc}", kind="connection", retriable=True) from exc
        if not assembly.stopped:
            raise ProviderError("anthropic: the stream ended before `message_stop`", kind="stream", retriable=True)
        yield Done(assembly.response())
