"""The LLM call of a step: the model's fallback chain, retries, stream timeouts, chunks, logs and events, and the
thread's images the request refers to, read into it.

Every request (each attempt at each model) is one `logs` row and one `llm_request` event; a switch to the next
model is a `fallback_triggered` event. Streamed deltas go out live as `message_chunk` / `reasoning_chunk` with the
attempt they belong to (a retry starts again at offset 0). No transaction is held while the model streams.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from app import db, errors, events, files, llm, tables
from app.catalog import Catalog
from app.engine.context import Env, MissingVariable, scrub, scrub_data
from app.hub import Publisher
from app.llm import recovery, retry
from app.llm.base import (
    CallContext,
    Done,
    LLMRequest,
    LLMResponse,
    Model,
    ProviderError,
    ReasoningDelta,
    TextDelta,
)
from app.metrics import Meter
from app.spec.definitions import ModelDefinition, PromptDefinition
from app.spec.messages import LLMMessage
from app.spec.results import ToolResult

Transaction = Callable[[], AbstractAsyncContextManager[tuple[AsyncSession, tables.Thread]]]
log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.2  # how often a streaming message's partial text reaches its row (`storage-and-queue.md`)
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass
class Result:
    """The outcome of a step's call: the response (or the last error) and the model that gave it."""

    response: LLMResponse | ProviderError
    model: ModelDefinition
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    record: tables.Log | None = None  # the request's log row, until it is written (`write`)


@dataclass
class _Attempt:
    model: ModelDefinition
    number: int
    retry_of: uuid.UUID | None = None
    fallback_of: uuid.UUID | None = None


def api_key(definition: ModelDefinition, env: Env, process_env: Mapping[str, str]) -> str | None:
    """The value of the model's key variable: the thread's env chain first, then the process env."""
    name = definition.api_key_env or DEFAULT_KEY_ENV.get(definition.provider)
    if name is None:
        return None
    try:
        return env.get(name)
    except MissingVariable:
        return process_env.get(name)


def scrub_result(result: ToolResult, secrets: list[str]) -> ToolResult:
    """A tool result with known secret values masked in what is stored, shown to models and returned."""
    if not secrets:
        return result
    changes = {
        key: scrub(value, secrets)
        for key in ("result", "error", "stack")
        if isinstance(value := getattr(result, key), str)
    }
    if result.error_data:
        changes["error_data"] = scrub_data(result.error_data, secrets)
    return result.model_copy(update=changes)


def empty(response: LLMResponse) -> bool:
    return not response.text.strip() and not response.tool_calls


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
        self.meter = meter
        self._publisher = publisher
        self._http = http
        self._policy = policy
        self._process_env = process_env
        self._models: dict[str, Model] = {}

    def _model(self, definition: ModelDefinition) -> Model:
        if definition.name not in self._models:
            self._models[definition.name] = llm.build(definition, self._http)
        return self._models[definition.name]

    async def call(
        self,
        tx: Transaction,
        thread_id: uuid.UUID,
        message_id: uuid.UUID,
        prompt: PromptDefinition,
        request: LLMRequest,
        env: Env,
        depth: int = 0,
        *,
        opened: int | None = None,
        defer: bool = False,
    ) -> Result:
        """Try the prompt's model and its fallbacks until one answers; an empty answer is asked again once.

        `depth` is the message's (a subprompt's message is deeper than 0), for its chunk events. `opened`: the
        caller's transaction already announced the first request (`announce`) and counted the requests made before
        it. `defer`: the last request's record (its log row and `llm_response`) is left in `Result.record` for the
        caller to write with the message it answers, instead of in a transaction of its own. A record not deferred is
        written in the next transaction the call makes anyway (the next attempt's, or a fallback's)."""
        chain = retry.chain(self._catalog, prompt.model)
        last: Result | None = None
        previous: uuid.UUID | None = None
        asked_again = False
        for index, definition in enumerate(chain):
            if index > 0 and last is not None:
                error = last.response.message if isinstance(last.response, ProviderError) else "no answer"
                async with tx() as (session, thread):
                    await write(session, last)
                    await events.append(
                        session,
                        thread.id,
                        "fallback_triggered",
                        {"from": chain[index - 1].name, "to": definition.name, "error": error},
                    )
            attempt = _Attempt(definition, 1, fallback_of=previous if index > 0 else None)
            while attempt.number <= self._policy.attempts:
                made = opened if last is None else None
                last, previous = await self._attempt(
                    tx, thread_id, message_id, prompt, request, env, attempt, depth, last, made
                )
                response = last.response
                if isinstance(response, LLMResponse):
                    if not empty(response) or asked_again:
                        return await self._finish(tx, last, defer)
                    asked_again = True  # an empty answer is asked again once, outside the retry budget
                    attempt = _Attempt(definition, attempt.number, retry_of=previous)
                    continue
                if not response.retriable or attempt.number == self._policy.attempts:
                    break
                await asyncio.sleep(self._policy.delay(response, attempt.number))
                attempt = _Attempt(definition, attempt.number + 1, retry_of=previous)
        assert last is not None
        return await self._finish(tx, last, defer)

    @staticmethod
    async def _finish(tx: Transaction, result: Result, defer: bool) -> Result:
        if not defer:
            async with tx() as (session, _):
                await write(session, result)
        return result

    async def _attempt(
        self,
        tx: Transaction,
        thread_id: uuid.UUID,
        message_id: uuid.UUID,
        prompt: PromptDefinition,
        request: LLMRequest,
        env: Env,
        attempt: _Attempt,
        depth: int,
        before: Result | None,
        made: int | None,
    ) -> tuple[Result, uuid.UUID]:
        """One request; `before` is the previous attempt, whose record this one's opening transaction writes, and
        `made` the requests already counted when the caller announced this one."""
        definition = attempt.model
        if made is None:
            async with tx() as (session, _):
                if before is not None:
                    await write(session, before)
                made = await announce(session, thread_id, definition, attempt.number)
        key = api_key(definition, env, self._process_env)
        secrets = [*env.secrets(), *([key] if key else [])]
        request = dataclasses.replace(
            request,
            model=definition.model or definition.name,
            provider_options={**definition.provider_options, **prompt.provider_options},
            max_tokens=definition.capabilities.max_output_tokens,
        )
        context = CallContext(str(thread_id), made, key)
        result = await self._stream(tx, thread_id, request, definition, context, message_id, attempt.number, depth)
        result.response = _recovered(result.response, definition, request, f"recovered_{message_id.hex[:12]}")
        if isinstance(result.response, ProviderError):
            result.response.message = scrub(result.response.message, secrets)
            failed = result.response
            log.warning(
                "thread %s: model %s (attempt %d) failed: %s: %s",
                thread_id, definition.name, attempt.number, failed.kind, failed.message,
            )  # fmt: skip
        log_id = uuid.uuid4()
        result.record = _log_row(log_id, thread_id, message_id, attempt, result, request, secrets)
        self.meter.llm_request(result.record)
        return result, log_id

    async def _stream(
        self,
        tx: Transaction,
        thread_id: uuid.UUID,
        request: LLMRequest,
        definition: ModelDefinition,
        context: CallContext,
        message_id: uuid.UUID,
        attempt: int,
        depth: int,
    ) -> Result:
        """One request, its deltas published live; a provider error or timeout comes back as the response."""
        started = time.monotonic()
        ttft: float | None = None
        offsets = {"message_chunk": 0, "reasoning_chunk": 0}
        text: list[str] = []
        flushed = time.monotonic()

        def result(response: LLMResponse | ProviderError) -> Result:
            return Result(response, definition, (time.monotonic() - started) * 1000, ttft)

        stream = retry.guarded(self._model(definition).stream(request, context), self._policy, definition.timeout_s)
        try:
            async for event in stream:
                if isinstance(event, Done):
                    await self._publisher.sent()  # the deltas before the message that completes them
                    return result(event.response)
                assert isinstance(event, TextDelta | ReasoningDelta)
                kind = "message_chunk" if isinstance(event, TextDelta) else "reasoning_chunk"
                if ttft is None:
                    ttft = (time.monotonic() - started) * 1000
                data = {"message_id": str(message_id), "depth": depth, "offset": offsets[kind], "chunk": event.text}
                self._publisher.publish(thread_id, kind, {**data, "attempt": attempt})
                offsets[kind] += len(event.text)
                if kind == "message_chunk":
                    text.append(event.text)
                    if time.monotonic() - flushed >= FLUSH_SECONDS:
                        await _flush(tx, message_id, "".join(text))
                        flushed = time.monotonic()
        except ProviderError as exc:
            await self._publisher.sent()  # the deltas before the failure that ends them
            return result(exc)
        await self._publisher.sent()
        return result(ProviderError("the stream ended without a final response", kind="stream", retriable=True))


async def inline_images(session: AsyncSession, thread_id: uuid.UUID, messages: list[LLMMessage]) -> None:
    """Read the images a request refers to by path into base64 `data`; a file deleted since is left out."""
    for message in messages:
        kept = []
        for image in message.images:
            if image.path is not None and image.data is None and image.url is None:
                try:
                    image.data = base64.b64encode(await files.read_bytes(session, thread_id, image.path)).decode()
                except (errors.FileNotFound, errors.FileConflict, errors.BadPath):
                    continue
            kept.append(image)
        message.images = kept


async def _flush(tx: Transaction, message_id: uuid.UUID, partial: str) -> None:
    """Store the partial text of a streaming message (no event: clients that reconnect read it from the row)."""
    async with tx() as (session, _):
        await session.execute(
            update(tables.Message)
            .where(tables.Message.id == message_id, tables.Message.status == "pending")
            .values(content=partial)
        )


def _recovered(
    response: LLMResponse | ProviderError, definition: ModelDefinition, request: LLMRequest, prefix: str
) -> LLMResponse | ProviderError:
    """Tool calls a model wrote as text (`text_tool_calls` models), or that a provider refused as text."""
    if isinstance(response, ProviderError):
        if response.failed_generation is None:
            return response
        body = {"error": {"failed_generation": response.failed_generation}}
        return recovery.recover_failed_generation(body, request.tools, prefix=prefix) or response
    if definition.text_tool_calls:
        return recovery.recover(response, request.tools, prefix=prefix)
    return response


def _log_row(
    log_id: uuid.UUID,
    thread_id: uuid.UUID,
    message_id: uuid.UUID,
    attempt: _Attempt,
    result: Result,
    request: LLMRequest,
    secrets: list[str],
) -> tables.Log:
    """One `logs` row per request: what was asked, what came back, what it cost."""
    definition = attempt.model
    last = next((m for m in reversed(request.messages) if m.content), None)
    row = tables.Log(
        id=log_id,
        thread_id=thread_id,
        kind="llm",
        message_id=message_id,
        model=definition.name,
        provider=definition.provider,
        attempt=attempt.number,
        latency_ms=result.latency_ms,
        ttft_ms=result.ttft_ms,
        retry_of=attempt.retry_of,
        fallback_of=attempt.fallback_of,
        request={
            "model": request.model,
            "messages": len(request.messages),
            "tools": [t.name for t in request.tools],
            "last": scrub((last.content or "")[:300], secrets) if last else None,
        },
    )
    response = result.response
    if isinstance(response, ProviderError):
        row.status, row.error = "error", response.message
        row.response = {"kind": response.kind, "status": response.status}
        return row
    usage = response.usage
    row.status, row.finish_reason = "success", response.finish_reason
    row.input_tokens, row.output_tokens = usage.input_tokens, usage.output_tokens
    row.cached_tokens, row.reasoning_tokens = usage.cached_tokens, usage.reasoning_tokens
    row.cost = cost(definition, response)
    row.response = {
        "text": scrub(response.text[:500], secrets),
        "tool_calls": [c["function"]["name"] for c in response.tool_calls],
    }
    return row


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
    made = await _requests_made(session, thread_id, definition.name) if scripted else 0
    await events.append(session, thread_id, "llm_request", {"model": definition.name, "attempt": attempt})
    return made


async def write(session: AsyncSession, result: Result) -> None:
    """Write a request's record, once: its log row (with the transaction's events: `db.defer`; any statement that
    reads it sends it first) and, for an answer, its `llm_response` event."""
    row, result.record = result.record, None
    if row is None:
        return
    await db.defer(session, *db.insert_statement(row))
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


_REQUESTS_MADE = "SELECT count(*) FROM logs WHERE thread_id = $1 AND kind = 'llm' AND model = $2"


async def _requests_made(session: AsyncSession, thread_id: uuid.UUID, model: str) -> int:
    """Requests a thread has made to a model: the `test` provider's durable script position."""
    return int(await (await db.driver(session, flush=False)).fetchval(_REQUESTS_MADE, thread_id, model))
