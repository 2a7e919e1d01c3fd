"""The `openai` provider: any OpenAI-compatible Chat Completions server, streamed over the shared HTTP client.

One adapter serves OpenAI, OpenRouter, Groq, Together, DeepSeek, vLLM, Ollama and LM Studio; the few places where
servers differ are decided here, per host, and documented where they are decided:

- `max_tokens` is sent as `max_completion_tokens` to api.openai.com (its reasoning models refuse `max_tokens`) and
  as `max_tokens` everywhere else (the one spelling every compatible server reads).
- `parallel_tool_calls` is left out for OpenAI's o-series reasoning models (`o1`, `o3`, `o4-mini`, ..., also as
  `openai/o3` on OpenRouter): they answer 400 "Unsupported parameter" to it, even `false`, and call one tool at a time.
- `reasoning` is sent to OpenRouter as its `reasoning` object (effort, max_tokens, exclude) and elsewhere as
  `reasoning_effort`, the only reasoning setting compatible servers share; anything else goes in `provider_options`.
- An assistant turn's `reasoning_details` are replayed exactly as returned (OpenRouter); its reasoning text is replayed
  as `reasoning_content` only on turns that called tools, which DeepSeek and Kimi require in tool loops and vLLM reads.

The stream is read a network read at a time (`sse.batches`): the deltas of the chunks one read carries go out merged.
Streaming wire format: https://platform.openai.com/docs/api-reference/chat-streaming; reasoning fields:
https://openrouter.ai/docs/use-cases/reasoning-tokens and https://api-docs.deepseek.com/guides/thinking_mode.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
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

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
FINISH_REASONS = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length"}
CONCATENATED_DETAIL_FIELDS = ("text", "summary", "data")


def key_variable(definition: ModelDefinition) -> str:
    """The variable the model's API key is read from."""
    return definition.api_key_env or DEFAULT_KEY_ENV


def required_key(definition: ModelDefinition) -> str | None:
    """The variable the model cannot be called without: OpenAI and OpenRouter answer nothing but 401 without a key,
    a server of one's own (Ollama, vLLM) may take none."""
    host = _host(definition)
    return key_variable(definition) if _is_openai(host) or _is_openrouter(host) else None


def _host(definition: ModelDefinition) -> str:
    return httpx.URL(definition.base_url or DEFAULT_BASE_URL).host


_O_SERIES = re.compile(r"(?:openai/)?o\d")  # o1, o3-mini, o4-mini...: no `parallel_tool_calls`


def _is_openai(host: str) -> bool:
    return host == "api.openai.com"


def _is_openrouter(host: str) -> bool:
    return host == "openrouter.ai" or host.endswith(".openrouter.ai")


class OpenAIModel:
    """A model behind `POST {base_url}/chat/completions`, answered as server-sent events."""

    provider = "openai"

    def __init__(self, definition: ModelDefinition, http: httpx.AsyncClient) -> None:
        self.definition = definition
        self.http = http
        self.url = (definition.base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
        self.host = _host(definition)
        self.key_env = key_variable(definition)
        self.is_openai = _is_openai(self.host)
        self.is_openrouter = _is_openrouter(self.host)
        self.needs_key = required_key(definition) is not None

    def body(self, request: LLMRequest) -> dict[str, Any]:
        """The JSON body for `request`; `provider_options` are merged last and win."""
        streaming = self.definition.capabilities.supports_streaming
        body: dict[str, Any] = {"model": request.model, "messages": [_message(m) for m in request.messages]}
        body["stream"] = streaming
        if streaming:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
            # OpenAI refuses both without `tools`
            if request.tool_choice is not None:
                body["tool_choice"] = request.tool_choice
            if request.parallel_tool_calls is not None and not _O_SERIES.match(request.model):
                body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.max_tokens is not None:
            body["max_completion_tokens" if self.is_openai else "max_tokens"] = request.max_tokens
        body.update(self._reasoning(request.reasoning or {}))
        body.update(request.provider_options)
        return body

    def _reasoning(self, config: dict[str, Any]) -> dict[str, Any]:
        """The request's `ReasoningConfig` in the server's spelling."""
        if not self.is_openrouter:
            return {"reasoning_effort": config["effort"]} if config.get("effort") else {}
        reasoning = {k: config[k] for k in ("effort", "max_tokens") if config.get(k)}
        if config.get("exclude") or config.get("include") is False:
            reasoning["exclude"] = True
        elif config.get("include") and not reasoning:
            reasoning["enabled"] = True
        return {"reasoning": reasoning} if reasoning else {}

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        key = self._key(ctx.api_key)
        if key is None and self.needs_key:  # it would only answer 401 (a DNS error offline)
            raise ProviderError(f"openai: no API key: `{self.key_env}` is not set", kind="auth")
        headers = {"Accept": "text/event-stream"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        reply = _Reply()
        try:
            async with transport.streamed(
                self.http, "POST", self.url, json=self.body(request), headers=headers
            ) as response:
                if not response.is_success:
                    await response.aread()
                    raise self._http_error(response, key)
                if response.headers.get("content-type", "").startswith("application/json"):
                    reply.feed(_json(await response.aread()))  # a server that would not stream
                    for event in reply.take():
                        yield event
                else:
                    reads = sse.batches(response)
                    async for found in reads:  # what one read completed, its deltas merged
                        done = False
                        for data in found:
                            if not data.endswith("}") and data.strip() == "[DONE]":
                                done = True
                                break
                            reply.feed(_json(data))
                        for event in reply.take():
                            yield event
                        if done:
                            await sse.rest(reads)
                            break
        except httpx.TimeoutException as exc:
            raise ProviderError(
                masking.scrub(f"timed out talking to {self.host} ({type(exc).__name__})", [key] if key else []),
                retriable=True,
                kind="timeout",
            ) from exc
        except httpx.TransportError as exc:
            raise ProviderError(
                masking.scrub(f"could not talk to {self.host}: {exc or type(exc).__name__}", [key] if key else []),
                retriable=True,
                kind="connection",
            ) from exc
        except httpx.DecodingError as exc:
            raise ProviderError(f"undecodable response from {self.host}", retriable=True, kind="stream") from exc
        yield Done(reply.response())

    def _key(self, raw: str | None) -> str | None:
        """The API key to send, or None for servers without one; a key no header can carry is refused unread."""
        key = raw.strip() if raw else None
        if key and not (key.isascii() and key.isprintable()):
            raise ProviderError(
                f"the value of `{self.key_env}` is not a usable API key (it has control or non-ASCII characters)",
                kind="auth",
            )
        return key or None

    def _http_error(self, response: httpx.Response, key: str | None) -> ProviderError:
        status = response.status_code
        if status in (401, 403):
            # the provider's text is left out: OpenAI's quotes part of the key
            hint = f"check `{self.key_env}`" if key else f"`{self.key_env}` is not set"
            return ProviderError(
                f"{self.host} refused the credentials (HTTP {status}): {hint}", status=status, kind="auth"
            )
        detail = masking.scrub(_error_detail(response), [key] if key else [])
        error = _classify(f"HTTP {status} from {self.host}: {detail}", status, _retry_after(response.headers))
        error.failed_generation = _failed_generation(response)
        return error


class _Reply:
    """The response assembled from streamed chunks, and the deltas to stream not taken yet (`take`)."""

    def __init__(self) -> None:
        self.deltas: list[StreamEvent] = []
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.details: list[dict[str, Any]] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.slots: dict[int, int] = {}  # wire index → key in `calls`
        self.finish: str | None = None
        self.usage = Usage()

    def take(self) -> list[StreamEvent]:
        """The deltas of the chunks fed since the last call, consecutive ones of one kind merged."""
        deltas, self.deltas = self.deltas, []
        return deltas

    def feed(self, chunk: Any) -> None:
        """Take one chunk; its deltas join `deltas`."""
        if not isinstance(chunk, dict):
            raise ProviderError("malformed stream chunk: not a JSON object", retriable=True, kind="stream")
        if chunk.get("error"):
            raise _stream_error(chunk["error"])
        usage = chunk.get("usage")
        if usage is None and isinstance(chunk.get("x_groq"), dict):  # Groq reports it under `x_groq`
            usage = chunk["x_groq"].get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            self._delta(choice.get("delta") or choice.get("message") or {})
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])

    def _delta(self, delta: dict[str, Any]) -> None:
        # DeepSeek, LM Studio and older vLLM say `reasoning_content`; OpenRouter, Groq, Ollama say `reasoning`
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            sse.merge(self.deltas, ReasoningDelta, reasoning)
        if isinstance(delta.get("reasoning_details"), list):
            _merge_details(self.details, delta["reasoning_details"])
        for field in ("content", "refusal"):
            text = delta.get(field)
            if isinstance(text, str) and text:
                self.text.append(text)
                sse.merge(self.deltas, TextDelta, text)
        if tool_calls := delta.get("tool_calls"):
            for position, part in enumerate(tool_calls):
                if isinstance(part, dict):
                    self._tool_call(part, position)

    def _tool_call(self, part: dict[str, Any], position: int) -> None:
        """Assemble a call by its `index`: id and name from its first delta, arguments concatenated."""
        index = part["index"] if isinstance(part.get("index"), int) else position
        slot = self.slots.get(index)
        call_id = part.get("id")
        if slot is None or (call_id and self.calls[slot]["id"] and call_id != self.calls[slot]["id"]):
            # a new call; also when a server reuses an index for a call with another id
            slot = self.slots[index] = len(self.calls)
            self.calls[slot] = {"id": "", "name": "", "arguments": ""}
        call = self.calls[slot]
        function = part.get("function") or {}
        if isinstance(call_id, str) and not call["id"]:
            call["id"] = call_id
        if isinstance(function.get("name"), str) and not call["name"]:
            call["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call["arguments"] += arguments
        elif isinstance(arguments, dict):
            call["arguments"] = json.dumps(arguments)

    def response(self) -> LLMResponse:
        """The final response; a stream that never said why it finished was cut off."""
        if self.finish is None:
            raise ProviderError("the stream ended before the model finished", retriable=True, kind="stream")
        if self.finish == "error":  # OpenRouter, when the upstream provider failed mid-generation
            raise ProviderError("the provider failed mid-generation", retriable=True, kind="server")
        calls: list[ToolCall] = [
            {
                "id": c["id"] or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"] or "{}"},
            }
            for _, c in sorted(self.calls.items())
        ]
        finish = FINISH_REASONS.get(self.finish, self.finish)
        if calls and finish == "stop":  # some local servers say `stop` after tool calls
            finish = "tool_calls"
        return LLMResponse(
            text="".join(self.text),
            tool_calls=calls,
            reasoning="".join(self.reasoning) or None,
            reasoning_details=self.details or None,
            usage=self.usage,
            finish_reason=finish,
        )


def _message(m: LLMMessage) -> dict[str, Any]:
    """One message in the Chat Completions shape."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content or ""}
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.role == "user" and m.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
        for image in m.images:
            url = image.url or f"data:{image.mime_type};base64,{image.data}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        out["content"] = parts
    if m.name is not None:
        out["name"] = m.name
    if m.role == "assistant":
        if m.tool_calls:
            out["content"] = m.content or None
            out["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": dict(c["function"])} for c in m.tool_calls
            ]
        if m.reasoning_details is not None:
            out["reasoning_details"] = m.reasoning_details
        elif m.reasoning and m.tool_calls:
            out["reasoning_content"] = m.reasoning
    return out


def _json(raw: str | bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ProviderError("malformed stream chunk: not JSON", retriable=True, kind="stream") from exc


def _merge_details(details: list[dict[str, Any]], parts: list[Any]) -> None:
    """Append streamed `reasoning_details`, joining the fragments of one block (same `index` and `type`)."""
    for part in parts:
        if not isinstance(part, dict):
            continue
        last = details[-1] if details else None
        if (
            last is None
            or "index" not in part
            or (last.get("index"), last.get("type")) != (part["index"], part.get("type"))
        ):
            details.append(dict(part))
            continue
        for name, value in part.items():
            if name in CONCATENATED_DETAIL_FIELDS and isinstance(value, str) and isinstance(last.get(name), str):
                last[name] += value
            elif value is not None:
                last[name] = value


def _usage(raw: dict[str, Any]) -> Usage:
    """Token counts; `input_tokens` includes the cached ones, `output_tokens` the reasoning ones (as OpenAI counts)."""
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=_int(raw.get("prompt_tokens")),
        output_tokens=_int(raw.get("completion_tokens")),
        # DeepSeek reports its cache hits as `prompt_cache_hit_tokens`
        cached_tokens=_int(prompt_details.get("cached_tokens")) or _int(raw.get("prompt_cache_hit_tokens")),
        reasoning_tokens=_int(completion_details.get("reasoning_tokens")),
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _classify(message: str, status: int | None, retry_after: float | None = None) -> ProviderError:
    """The error for an HTTP status: 408 and 409 are transient, as 429 and every 5xx are."""
    if status == 429:
        return ProviderError(message, status=status, retriable=True, kind="rate_limited", retry_after=retry_after)
    if status is not None and (status >= 500 or status == 409):
        return ProviderError(message, status=status, retriable=True, kind="server", retry_after=retry_after)
    if status == 408:
        return ProviderError(message, status=status, retriable=True, kind="timeout")
    if status in (401, 403):
        return ProviderError(message, status=status, kind="auth")
    return ProviderError(message, status=status, kind="bad_request")


def _stream_error(error: Any) -> ProviderError:
    """An error object sent inside the stream: classified by its HTTP-like `code`, else a retriable server error."""
    if not isinstance(error, dict):
        return ProviderError(f"the provider reported an error mid-stream: {error}", retriable=True, kind="server")
    message = f"the provider reported an error mid-stream: {error.get('message') or error}"
    code = error.get("code")
    if isinstance(code, int) and 400 <= code < 600:
        return _classify(message, code)
    if error.get("type") == "invalid_request_error":
        return ProviderError(message, kind="bad_request")
    return ProviderError(message, retriable=True, kind="server")


def _error_detail(response: httpx.Response) -> str:
    """The provider's own error message from a failed response's body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or json.dumps(error)[:500]
        raw = (error.get("metadata") or {}).get("raw")  # OpenRouter: the upstream provider's own words
        return f"{message} ({raw})" if isinstance(raw, str) and raw else str(message)
    return str(error)[:500]


def _failed_generation(response: httpx.Response) -> str | None:
    """Groq's `tool_use_failed` 400 carries the model's tool call as text in `error.failed_generation`."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    value = error.get("failed_generation") if isinstance(error, dict) else None
    return value if isinstance(value, str) and value else None


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds to wait, from `retry-after-ms` (OpenAI) or `Retry-After` as seconds or an HTTP date."""
    try:
        return max(0.0, float(headers["retry-after-ms"]) / 1000)
    except (KeyError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
