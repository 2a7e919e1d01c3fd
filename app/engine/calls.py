"""The LLM call of a step as the engine records it, and the thread's images a request refers to, read into it.

Which requests a call makes (retries, stream timeouts, the fallback chain) is `retry.FallbackModel`'s; what each
leaves behind is this module's (`_Recorder`).

Every request (each attempt at each model) is one `logs` row and one `llm_request` event; a switch to the next
model is a `fallback_triggered` event. Streamed deltas go out live as `message_chunk` / `reasoning_chunk` with the
attempt they belong to (a retry starts again at offset 0). No transaction is held while the model streams.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry.trace import Span, SpanKind
from sqlalchemy.ext.asyncio import AsyncSession

from app import errors, events, files, llm, logs, masking, tables, tracing
from app.catalog import Catalog
from app.engine import tally, types
from app.hub import Publisher
from app.llm import recovery, retry
from app.llm.base import (
    CallContext,
    LLMRequest,
    LLMResponse,
    LLMTool,
    Model,
    ProviderError,
    ReasoningDelta,
    TextDelta,
)
from app.metrics import Meter
from app.spec.definitions import ModelDefinition, PromptDefinition
from app.spec.messages import LLMImage, LLMMessage
from app.spec.results import ToolResult

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.2  # how often a streaming message's partial text reaches its row (`storage-and-queue.md`)


@dataclass
class Result:
    """The outcome of a step's call: the response (or the last error) and the model that gave it."""

    response: LLMResponse | ProviderError
    model: ModelDefinition
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    record: tables.Log | None = None  # the request's log row, until it is written (`write`)


def api_key(definition: ModelDefinition, env: types.Env, process_env: Mapping[str, str]) -> str | None:
    """The value of the model's key variable: the thread's env chain first, then the process env."""
    name = llm.KEY_VARIABLES[definition.provider](definition)
    if name is None:
        return None
    try:
        return env.get(name)
    except types.MissingVariable:
        return process_env.get(name)


def scrub_result(result: ToolResult, secrets: list[str]) -> ToolResult:
    """A tool result with known secret values masked in what is stored, shown to models and returned."""
    if not secrets:
        return result
    changes = {
        key: masking.scrub(value, secrets)
        for key in ("result", "error", "stack")
        if isinstance(value := getattr(result, key), str)
    }
    if result.error_data:
        changes["error_data"] = masking.scrub_data(result.error_data, secrets)
    return result.model_copy(update=changes)


class Caller:
    """Makes the LLM calls of steps for one engine; one `Model` per definition, sharing one HTTP client."""

    def __init__(
        self,
        catalog: Catalog,
        publisher: Publisher,
        http: httpx.AsyncClient,
        policy: retry.Policy,
        process_env: Mapping[str, str],
        meter: Meter,
    ) -> None:
        self._catalog = catalog
        self.full_requests = False  # `LOG_REQUESTS=full`: each log row keeps the whole request (`full_request`)
        self.meter = meter
        self.publisher = publisher
        self._http = http
        self._policy = policy
        self.process_env = process_env
        self._models: dict[str, Model] = {}
        self.tallies = tally.Tallies()  # what each open turn's requests took (`Engine` says it when the turn ends)

    def _model(self, definition: ModelDefinition) -> Model:
        if definition.name not in self._models:
            self._models[definition.name] = llm.build(definition, self._http)
        return self._models[definition.name]

    async def call(
        self,
        tx: types.Transaction,
        thread_id: uuid.UUID,
        message_id: uuid.UUID,
        prompt: PromptDefinition,
        request: LLMRequest,
        env: types.Env,
        depth: int = 0,
        *,
        opened: int | None = None,
        defer: bool = False,
        live: bool = False,
        partial: types.Partial,
    ) -> Result:
        """Ask the prompt's model through its retries and fallbacks (`retry.FallbackModel`), recording each request.

        `depth` is the message's (a subprompt's message is deeper than 0), for its chunk events. `opened`: the
        caller's transaction already announced the first request (`announce`) and counted the requests made before
        it. `defer`: the last request's record (its log row and `llm_response`) is left in `Result.record` for the
        caller to write with the message it answers, instead of in a transaction of its own. A record not deferred is
        written in the next transaction the call makes anyway (the next attempt's, or a fallback's). `live`: an answer
        returns without waiting for its deltas to be sent: the caller's statement that stores it sends what is left
        of them (`Publisher.take`, `events.notify_first`); a failure, or an empty answer (asked again), still waits.
        `partial` stores the streaming message's text so far (`Transactions.partial`: one statement, for a step's
        answer and a subprompt's alike)."""
        recorder = _Recorder(self, tx, thread_id, message_id, prompt, env, depth, opened, partial, live)
        prefix = f"recovered_{message_id.hex[:12]}"  # recovered tool call ids must be unique within the thread
        chain = [
            (definition, recovery.RecoveringModel(self._model(definition), prefix, text=definition.text_tool_calls))
            for definition in retry.chain(self._catalog.models, prompt.model)
        ]
        model = retry.FallbackModel(chain, self._policy, recorder)
        primary = chain[0][0]
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": primary.provider,
            "gen_ai.request.model": primary.model or primary.name,
            "agents.model": primary.name,
            "agents.prompt": prompt.name,
        }
        with tracing.span(f"chat {primary.model or primary.name}", attributes, kind=SpanKind.CLIENT) as span:
            # each request's script position and key are given by the recorder (`_Recorder.open`)
            with contextlib.suppress(ProviderError):  # every model failed: the last error is the last record's
                async for event in model.stream(request, CallContext(str(thread_id), 0)):
                    if isinstance(event, TextDelta | ReasoningDelta):
                        await recorder.delta(event)
            assert recorder.last is not None
            if span is not None:
                _traced(span, recorder.last)
        if not defer:
            async with tx() as (session, _):
                await write(session, recorder.last)
        return recorder.last


@dataclass
class _InFlight:
    """The request being made: what was sent, the secrets masked in what it leaves behind, its timing and text."""

    attempt: retry.Attempt
    request: LLMRequest
    secrets: list[str]
    started: float = dataclasses.field(default_factory=time.monotonic)
    ttft: float | None = None
    offsets: dict[str, int] = dataclasses.field(default_factory=lambda: {"message_chunk": 0, "reasoning_chunk": 0})
    text: list[str] = dataclasses.field(default_factory=list)
    flushed: float = dataclasses.field(default_factory=time.monotonic)


class _Recorder:
    """What the engine makes of each request of a call (`retry.Attempts`): its `llm_request` event before it, its
    deltas live, its log row and metrics after it, and a `fallback_triggered` event between models."""

    def __init__(
        self,
        caller: Caller,
        tx: types.Transaction,
        thread_id: uuid.UUID,
        message_id: uuid.UUID,
        prompt: PromptDefinition,
        env: types.Env,
        depth: int,
        opened: int | None,
        partial: types.Partial,
        live: bool = False,
    ) -> None:
        self._caller = caller
        self._live = live  # an answer's last deltas ride in the statement that stores it (`Caller.call`)
        self._tx = tx
        self._partial = partial
        self._thread_id = thread_id
        self._message_id = message_id
        self._prompt = prompt
        self._env = env
        self._depth = depth
        self._opened = opened
        self._current: _InFlight | None = None
        self.last: Result | None = None  # the latest request's outcome; its record is written by a later transaction
        self._log_id: uuid.UUID | None = None  # the latest request's log row, which the next request follows

    async def open(
        self, attempt: retry.Attempt, request: LLMRequest, ctx: CallContext
    ) -> tuple[LLMRequest, CallContext]:
        """Write the request before it and announce this one (unless the caller did: `opened`); the request as the
        attempt's model is sent it, with its key."""
        definition = attempt.model
        if attempt.follows is not None:
            tracing.event(
                f"gen_ai.{attempt.follows}",
                {"gen_ai.request.model": definition.model or definition.name, "agents.attempt": attempt.number},
            )
        made = self._opened if self.last is None else None
        if made is None:
            async with self._tx() as (session, _):
                if self.last is not None:
                    await write(session, self.last)
                made = await announce(session, self._thread_id, definition, attempt.number)
        key = api_key(definition, self._env, self._caller.process_env)
        sent = dataclasses.replace(
            request,
            model=definition.model or definition.name,
            provider_options={**definition.provider_options, **self._prompt.provider_options},
            max_tokens=definition.capabilities.max_output_tokens,
        )
        self._current = _InFlight(attempt, sent, [*self._env.secrets(), *([key] if key else [])])
        return sent, dataclasses.replace(ctx, call_index=made, api_key=key)

    async def delta(self, event: TextDelta | ReasoningDelta) -> None:
        """Publish a delta live; the message's partial text reaches its row every `FLUSH_SECONDS`."""
        current = self._current
        assert current is not None
        kind = "message_chunk" if isinstance(event, TextDelta) else "reasoning_chunk"
        if current.ttft is None:
            current.ttft = (time.monotonic() - current.started) * 1000
        offset, attempt = current.offsets[kind], current.attempt.number
        data = {"message_id": str(self._message_id), "depth": self._depth, "offset": offset, "chunk": event.text}
        self._caller.publisher.publish(self._thread_id, kind, {**data, "attempt": attempt})
        current.offsets[kind] += len(event.text)
        if kind == "message_chunk":
            current.text.append(event.text)
            if time.monotonic() - current.flushed >= FLUSH_SECONDS:
                await self._partial(self._message_id, "".join(current.text))
                current.flushed = time.monotonic()

    async def close(self, attempt: retry.Attempt, outcome: LLMResponse | ProviderError) -> None:
        """The request's outcome, its error masked and logged, and its log row (written by the next transaction)."""
        current = self._current
        assert current is not None
        # the deltas before the failure that ends them, or before an empty answer's next request (`retry`: asked
        # again); an answer's ride in the statement that stores it (`live`)
        if isinstance(outcome, ProviderError) or retry.empty(outcome) or not self._live:
            await self._caller.publisher.sent()
        result = Result(outcome, attempt.model, (time.monotonic() - current.started) * 1000, current.ttft)
        if isinstance(outcome, ProviderError):
            outcome.message = masking.scrub(outcome.message, current.secrets)
            log.warning(
                "thread %s: model %s (attempt %d) failed: %s: %s",
                self._thread_id, attempt.model.name, attempt.number, outcome.kind, outcome.message,
            )  # fmt: skip
        elif tracing.content():  # the answer itself, secrets masked: only when `OTEL_CAPTURE_CONTENT=true`
            tracing.event(
                "gen_ai.choice",
                {"gen_ai.response.model": attempt.model.name, "content": masking.scrub(outcome.text, current.secrets)},
            )
        log_id = uuid.uuid4()
        result.record = _log_row(log_id, self._thread_id, self._message_id, current, result, self._log_id)
        if self._caller.full_requests:
            result.record.request_full = full_request(current.request, current.secrets)
        self._caller.meter.llm_request(result.record)
        self._caller.tallies.of(self._thread_id).add(result.record)
        self.last, self._log_id = result, log_id

    async def fall_back(self, failed: retry.Attempt, to: ModelDefinition) -> None:
        """Write the failed model's last request and a `fallback_triggered` event naming its error."""
        last = self.last
        assert last is not None and isinstance(last.response, ProviderError)
        tracing.event(
            "gen_ai.fallback",
            {"agents.from": failed.model.name, "agents.to": to.name, "error.type": last.response.kind},
        )
        async with self._tx() as (session, thread):
            await write(session, last)
            await events.append(
                session,
                thread.id,
                "fallback_triggered",
                {"from": failed.model.name, "to": to.name, "error": last.response.message},
            )


def _traced(span: Span, result: Result) -> None:
    """A call's span after it: the model that answered, its usage and finish reason, or the kind of its failure."""
    definition, response = result.model, result.response
    span.set_attribute("gen_ai.system", definition.provider)
    span.set_attribute("gen_ai.response.model", definition.model or definition.name)
    if isinstance(response, ProviderError):
        tracing.failed(span, response.kind)
        return
    span.set_attribute("gen_ai.usage.input_tokens", response.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", response.usage.output_tokens)
    span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
    span.set_attribute("agents.tool_calls", len(response.tool_calls))


async def inline_images(session: AsyncSession, thread_id: uuid.UUID, messages: list[LLMMessage]) -> None:
    """Read the images a request refers to by path into base64 `data`; a file deleted since is left out. A message
    with images is replaced by a copy, not changed: the thread's transcript keeps the messages (`transcript`)."""
    for index, message in enumerate(messages):
        if not message.images:
            continue
        kept = []
        for image in message.images:
            if image.path is not None and image.data is None and image.url is None:
                try:
                    data = base64.b64encode(await files.read_bytes(session, thread_id, image.path)).decode()
                except (errors.FileNotFound, errors.FileConflict, errors.BadPath):
                    continue
                image = dataclasses.replace(image, data=data)
            kept.append(image)
        messages[index] = dataclasses.replace(message, images=kept)


def _log_row(
    log_id: uuid.UUID,
    thread_id: uuid.UUID,
    message_id: uuid.UUID,
    sent: _InFlight,
    result: Result,
    previous: uuid.UUID | None,
) -> tables.Log:
    """One `logs` row per request (`logs.llm`): the request in brief and the answer's start, secrets masked;
    `previous` is the log row of the request before it, which it retries or falls back from."""
    attempt, request, secrets = sent.attempt, sent.request, sent.secrets
    definition = attempt.model
    last = next((m for m in reversed(request.messages) if m.content), None)
    row = functools.partial(
        logs.llm,
        log_id,
        thread_id,
        message_id,
        model=definition.name,
        provider=definition.provider,
        attempt=attempt.number,
        latency_ms=result.latency_ms,
        ttft_ms=result.ttft_ms,
        retry_of=previous if attempt.follows == "retry" else None,
        fallback_of=previous if attempt.follows == "fallback" else None,
        request={
            "model": request.model,
            "messages": len(request.messages),
            "tools": [t.name for t in request.tools],
            "last": masking.scrub((last.content or "")[:300], secrets) if last else None,
        },
    )
    response = result.response
    if isinstance(response, ProviderError):
        return row(response={"kind": response.kind, "status": response.status}, error=response.message)
    return row(
        response={
            "text": masking.scrub(response.text[:500], secrets),
            "tool_calls": [c["function"]["name"] for c in response.tool_calls],
        },
        finish_reason=response.finish_reason,
        tokens=response.usage.as_dict(),
        cost=cost(definition, response),
    )


def full_request(request: LLMRequest, secrets: list[str]) -> dict[str, Any]:
    """The whole request a model was sent (`LOG_REQUESTS=full`): its messages, the tools offered with their schemas,
    its settings; known secret values masked, and an image's data given as its size (the file is the thread's).

    What `dataclasses.asdict` gives, built field by field: `asdict` deep-copies every value through its generic walk,
    which was the largest cost of a step at 1,000 messages (bench/README, P7). The dicts and lists inside (tool calls,
    schemas, options) are the request's own unless a secret is masked (then every part is a copy): read, not changed."""
    sent = {name: getattr(request, name) for name in _REQUEST_FIELDS}
    sent["messages"] = [_message_data(message) for message in request.messages]
    sent["tools"] = [{name: getattr(tool, name) for name in _TOOL_FIELDS} for tool in request.tools]
    if any(secrets):
        masked: dict[str, Any] = masking.scrub_data(sent, secrets)
        return masked
    return sent


def _message_data(message: LLMMessage) -> dict[str, Any]:
    data = {name: getattr(message, name) for name in _MESSAGE_FIELDS}
    data["images"] = [
        {
            **{name: getattr(image, name) for name in _IMAGE_FIELDS},
            "data": None if image.data is None else f"<{len(image.data) * 3 // 4} bytes of base64>",
        }
        for image in message.images
    ]
    return data


_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(LLMRequest))
_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(LLMMessage))
_TOOL_FIELDS = tuple(f.name for f in dataclasses.fields(LLMTool))
_IMAGE_FIELDS = tuple(f.name for f in dataclasses.fields(LLMImage))


def cost(definition: ModelDefinition, response: LLMResponse) -> float | None:
    """USD from the model's prices per million tokens; cached input at `cached_price` (else the input price)."""
    if definition.input_price is None and definition.output_price is None:
        return None
    usage = response.usage
    input_price = definition.input_price or 0.0
    cached_price = definition.cached_price if definition.cached_price is not None else input_price
    cached = min(usage.cached_tokens, usage.input_tokens)
    total = (
        (usage.input_tokens - cached) * input_price
        + cached * cached_price
        + usage.output_tokens * (definition.output_price or 0.0)
    )
    return total / 1_000_000


async def announce(session: AsyncSession, thread_id: uuid.UUID, definition: ModelDefinition, attempt: int) -> int:
    """Write a request's `llm_request` event; returns how many requests the thread made to the model before it (the
    `test` provider's script position; nothing else uses it, so it is counted only for a scripted `test` model)."""
    scripted = definition.provider == "test" and definition.respond is None
    made = await logs.requests_made(session, thread_id, definition.name) if scripted else 0
    await events.append(session, thread_id, "llm_request", {"model": definition.name, "attempt": attempt})
    return made


async def write(session: AsyncSession, result: Result) -> None:
    """Write a request's record, once: its log row (with the transaction's events: `logs.add`; any statement that
    reads it sends it first) and, for an answer, its `llm_response` event."""
    row, result.record = result.record, None
    if row is None:
        return
    await logs.add(session, row)
    if isinstance(result.response, LLMResponse):
        await events.append(
            session,
            row.thread_id,
            "llm_response",
            {
                "model": result.model.name,
                "tokens": result.response.usage.as_dict(),
                "latency_ms": round(result.latency_ms, 2),
                "ttft_ms": None if result.ttft_ms is None else round(result.ttft_ms, 2),
            },
        )
