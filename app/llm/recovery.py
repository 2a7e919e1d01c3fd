"""Tool calls a model wrote as text instead of calling natively, recovered into real `ToolCall`s.

For models flagged `text_tool_calls`. Strategies, in order, the first that finds a call of an offered tool wins:
Llama-style `<function=name>{…}</function>`, `<tool_call>{…}</tool_call>` wrappers, Markdown ```json blocks, then
raw JSON objects found by string-aware brace matching. Smart quotes are read as ASCII quotes. `RecoveringModel`
recovers them around any `Model`, and from the generation a provider refused as an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from app.llm.base import (
    CallContext,
    Done,
    LLMRequest,
    LLMResponse,
    LLMTool,
    Model,
    ProviderError,
    StreamEvent,
    aclose,
)
from app.spec.messages import ToolCall

_SMART_QUOTES = str.maketrans({"“": '"', "”": '"', "‘": "'", "’": "'"})  # one char each: offsets stay valid
_FUNCTION = re.compile(r"<function=([^\s>{<]+)>?\s*")
_FUNCTION_END = re.compile(r"\s*</function>")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_CODE_BLOCK = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL | re.IGNORECASE)
_OPENING = re.compile(r"[{\[]")
_BETWEEN_STRINGS = frozenset(" \t\r\n,:0123456789+-.Eeflnrstua")  # JSON outside strings, but brackets
_NOT_JSON = object()

_Call = tuple[str, dict[str, Any]]


@dataclass
class _Found:
    """Calls recovered from `text[start:end]`, the span removed from the answer."""

    start: int
    end: int
    calls: list[_Call]


def _closing(source: str, start: int, ends: dict[int, int | None]) -> int | None:
    """The end of the bracketed JSON value opening at `start`, brackets inside strings skipped; None if it never
    closes or meets what JSON cannot hold (a word outside strings, a line break inside one).

    `ends` remembers every bracket a scan settles, and prose stops a scan within a word, so text full of
    brackets stays about linear."""
    if start in ends:
        return ends[start]
    opened: list[int] = []
    in_string = escaped = False
    for i in range(start, len(source)):
        char = source[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            elif char < " ":
                break
        elif char == '"':
            in_string = True
        elif char in "{[":
            opened.append(i)
        elif char in "}]":
            ends[opened.pop()] = i + 1
            if not opened:
                break
        elif char not in _BETWEEN_STRINGS:
            break
    ends.update(dict.fromkeys(opened))
    return ends[start]


class _Text:
    """The answer, read as written and then with smart quotes as ASCII ones, and the names of the offered tools."""

    def __init__(self, text: str, names: set[str]) -> None:
        self.norm = text.translate(_SMART_QUOTES)
        self.sources = (text,) if self.norm == text else (text, self.norm)
        self.names = names
        self._ends: list[dict[int, int | None]] = [{} for _ in self.sources]

    def value(self, start: int) -> tuple[Any, int | None]:
        """The JSON value opening at `start` (`_NOT_JSON` if none) and where its brackets close (None if never)."""
        end = None
        for source, ends in zip(self.sources, self._ends, strict=True):
            if (closed := _closing(source, start, ends)) is None:
                continue
            end = end or closed
            if (value := _loads(source[start:closed])) is not _NOT_JSON:
                return value, closed
        return _NOT_JSON, end

    def loads(self, start: int, end: int) -> Any:
        """The JSON value in `[start, end)`, as written or else with ASCII quotes; `_NOT_JSON` if neither parses."""
        for source in self.sources:
            if (value := _loads(source[start:end])) is not _NOT_JSON:
                return value
        return _NOT_JSON

    def calls(self, value: Any, *, need_arguments: bool) -> list[_Call] | None:
        """The calls a parsed value holds — one call, a list of them, or `{"tool_calls": [...]}` — or None if
        any part of it is not a call of an offered tool."""
        if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
            value = value["tool_calls"]
        items = value if isinstance(value, list) else [value]
        calls = [self.call(item, need_arguments=need_arguments) for item in items]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]

    def call(self, value: Any, *, need_arguments: bool) -> _Call | None:
        """`{"name", "arguments"|"parameters"}` (or the OpenAI `{"function": {...}}`) naming an offered tool."""
        if isinstance(value, dict) and "name" not in value and isinstance(value.get("function"), dict):
            value = value["function"]
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        key = next((k for k in ("arguments", "parameters") if k in value), None)
        if key is None:
            return None if need_arguments else (value["name"], {})
        arguments = value[key]
        if isinstance(arguments, str):  # the OpenAI wire shape: arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return value["name"], arguments


def _llama(t: _Text) -> list[_Found]:
    """`<function=name>{arguments}</function>`, also without the `>`; the closing tag may be missing."""
    found: list[_Found] = []
    for match in _FUNCTION.finditer(t.norm):
        name = match.group(1)
        if name not in t.names or (found and match.start() < found[-1].end):
            continue
        body = end = match.end()
        arguments: Any = {}
        if t.norm.startswith("{", body):
            arguments, closed = t.value(body)
            if closed is None or not isinstance(arguments, dict):
                continue
            end = closed
        tag = _FUNCTION_END.match(t.norm, end)
        if tag is None and end == body:
            continue  # a bare `<function=name>` is a mention, not a call
        found.append(_Found(match.start(), tag.end() if tag else end, [(name, arguments)]))
    return found


def _blocks(pattern: re.Pattern[str], *, need_arguments: bool) -> Callable[[_Text], list[_Found]]:
    """Every match of `pattern` whose group 1 is JSON holding only calls of offered tools."""

    def strategy(t: _Text) -> list[_Found]:
        found: list[_Found] = []
        for match in pattern.finditer(t.norm):
            calls = t.calls(t.loads(match.start(1), match.end(1)), need_arguments=need_arguments)
            if calls:
                found.append(_Found(match.start(), match.end(), calls))
        return found

    return strategy


def _raw(t: _Text) -> list[_Found]:
    """JSON objects and lists anywhere in the text; a closed bracket is taken whole or skipped whole, so a call
    nested in other JSON, or in malformed JSON, stays text."""
    found: list[_Found] = []
    position = 0
    while (match := _OPENING.search(t.norm, position)) is not None:
        start = match.start()
        value, end = t.value(start)
        if end is None:
            position = start + 1
            continue
        if calls := t.calls(value, need_arguments=True):
            found.append(_Found(start, end, calls))
        position = end
    return found


def _loads(text: str) -> Any:
    """`text` parsed as JSON, or `_NOT_JSON`."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return _NOT_JSON


_STRATEGIES: list[Callable[[_Text], list[_Found]]] = [
    _llama,
    _blocks(_TOOL_CALL, need_arguments=False),
    _blocks(_CODE_BLOCK, need_arguments=True),
    _raw,
]


def recover(response: LLMResponse, tools: list[LLMTool], *, prefix: str = "recovered") -> LLMResponse:
    """The response with the tool calls written in its text made real calls (ids `<prefix>_<n>`) and cut out, the
    text left around them joined by line breaks; unchanged when it has native calls or no call of an offered tool.

    Tool call ids must be unique within a thread (results are matched to calls by id), so a caller recovering
    more than one answer per thread passes a `prefix` unique to the answer."""
    if response.tool_calls or not tools or not response.text:
        return response
    t = _Text(response.text, {tool.name for tool in tools})
    found: list[_Found] = []
    for strategy in _STRATEGIES:
        if found := strategy(t):
            break
    if not found:
        return response
    calls: list[ToolCall] = [
        {
            "id": f"{prefix}_{n}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
        }
        for n, (name, arguments) in enumerate(call for f in found for call in f.calls)
    ]
    starts = [0, *(f.end for f in found)]
    ends = [*(f.start for f in found), len(response.text)]
    kept = [response.text[a:b].strip() for a, b in zip(starts, ends, strict=True)]
    return replace(response, text="\n".join(k for k in kept if k), tool_calls=calls, finish_reason="tool_calls")


def recover_failed_generation(
    error_body: dict[str, Any], tools: list[LLMTool], *, prefix: str = "recovered"
) -> LLMResponse | None:
    """The calls in the `error.failed_generation` text of a Groq `tool_use_failed` 400, or None if it has none."""
    error = error_body.get("error")
    text = error.get("failed_generation") if isinstance(error, dict) else None
    if not isinstance(text, str):
        return None
    response = recover(LLMResponse(text=text), tools, prefix=prefix)
    return response if response.tool_calls else None


class RecoveringModel:
    """`model` with the tool calls it wrote as text made real: in its answers if `text` (`text_tool_calls` models),
    and in the generation a provider refused as an error (Groq `tool_use_failed`), whatever the model."""

    def __init__(self, model: Model, prefix: str, *, text: bool) -> None:
        self.provider = model.provider
        self._model = model
        self._prefix = prefix  # unique to the answer: recovered call ids must be unique within a thread
        self._text = text

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        events = self._model.stream(request, ctx)
        try:
            async for event in events:
                if isinstance(event, Done) and self._text:
                    event = Done(recover(event.response, request.tools, prefix=self._prefix))
                yield event
        except ProviderError as exc:
            if exc.failed_generation is None:
                raise
            body = {"error": {"failed_generation": exc.failed_generation}}
            recovered = recover_failed_generation(body, request.tools, prefix=self._prefix)
            if recovered is None:
                raise
            yield Done(recovered)
        finally:
            await aclose(events)
