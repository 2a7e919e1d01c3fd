"""Resilience around any `Model`: first-chunk and stall timeouts, retries with backoff, the fallback chain.

`FallbackModel` is itself a `Model`. Two attempts per model (a retriable error is tried again after an exponential
backoff, or the provider's `Retry-After`), then each of the model's `fallbacks` in order. A final error (a bad
request, a refused key) is not tried again on the same model, but the next model of the chain may still accept the
request. An empty answer is asked again once per call, outside the attempts. A user stop cancels the task:
`CancelledError` is never caught here, so a stop never walks the chain. What each request sends and what it leaves
behind (events, log rows) is the caller's, through `Attempts`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from app.llm import waiting
from app.llm.base import CallContext, Done, LLMRequest, LLMResponse, Model, ProviderError, StreamEvent, aclose
from app.settings import Settings
from app.spec.definitions import ModelDefinition


@dataclass(frozen=True)
class Policy:
    """How hard to try: attempts per model, stream timeouts, backoff."""

    attempts: int = 2
    first_chunk_timeout: float = 120.0
    stall_timeout: float = 45.0
    backoff: float = 1.0  # seconds before the second attempt; doubles after that
    max_delay: float = 60.0  # the longest wait, even when `Retry-After` asks for more

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(
            attempts=settings.llm_attempts,
            first_chunk_timeout=settings.llm_first_chunk_timeout,
            stall_timeout=settings.llm_stall_timeout,
            backoff=settings.llm_backoff,
            max_delay=settings.llm_max_delay,
        )

    def delay(self, error: ProviderError, attempt: int) -> float:
        """The wait before attempt `attempt + 1`: the provider's `Retry-After` if it sent one, else exponential."""
        wait = error.retry_after if error.retry_after is not None else self.backoff * 2 ** (attempt - 1)
        return max(0.0, min(wait, self.max_delay))


def chain(models: Mapping[str, ModelDefinition], primary: str) -> list[ModelDefinition]:
    """The model and its fallbacks, in the order they are tried (each model once)."""
    out: list[ModelDefinition] = []
    for name in [primary, *models[primary].fallbacks]:
        definition = models.get(name)
        if definition is not None and definition not in out:
            out.append(definition)
    return out


def empty(response: LLMResponse) -> bool:
    """An answer with neither text nor tool calls."""
    return not response.text.strip() and not response.tool_calls


@dataclass(frozen=True)
class Attempt:
    """One request of a call: the model of the chain it goes to, its attempt number there, and what it follows."""

    model: ModelDefinition
    number: int = 1
    follows: Literal["retry", "fallback"] | None = None  # the request before it failed (or answered nothing)


class Attempts(Protocol):
    """The caller's part in each request a `FallbackModel` makes: what it sends, and what it records."""

    async def open(self, attempt: Attempt, request: LLMRequest, ctx: CallContext) -> tuple[LLMRequest, CallContext]:
        """Before a request: the request and the context `attempt.model` is sent."""
        ...

    async def close(self, attempt: Attempt, outcome: LLMResponse | ProviderError) -> None:
        """After a request: how it ended, before the next one is decided."""
        ...

    async def fall_back(self, failed: Attempt, to: ModelDefinition) -> None:
        """Between the last request to a model and the first to the next model of the chain."""
        ...


class FallbackModel:
    """The models of a chain, each tried `policy.attempts` times, as one `Model`: it streams the deltas of every
    request and ends with the first answer, or raises the last model's last error."""

    provider = "fallback"

    def __init__(self, models: Sequence[tuple[ModelDefinition, Model]], policy: Policy, attempts: Attempts) -> None:
        self._models = models
        self._policy = policy
        self._attempts = attempts

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        """The chain's answer; the execution's slot among those at work (`waiting`) is given up meanwhile and taken
        back before the answer or the last error is handed on (not when the call is cancelled)."""
        slot = waiting.current.get()
        if slot is not None:
            slot.away()
        asked_again = False
        failed: Attempt | None = None
        error: ProviderError | None = None
        for definition, model in self._models:
            if failed is not None:
                await self._attempts.fall_back(failed, definition)
            attempt = Attempt(definition, 1, None if failed is None else "fallback")
            while True:
                sent, context = await self._attempts.open(attempt, request, ctx)
                outcome: LLMResponse | ProviderError
                outcome = ProviderError("the stream ended without a final response", kind="stream", retriable=True)
                events = guarded(model.stream(sent, context), self._policy, definition.timeout_s)
                try:
                    async for event in events:
                        if isinstance(event, Done):
                            outcome = event.response
                            break
                        yield event
                except ProviderError as exc:
                    outcome = exc
                finally:
                    await aclose(events)
                await self._attempts.close(attempt, outcome)
                if isinstance(outcome, LLMResponse):
                    if not empty(outcome) or asked_again:
                        if slot is not None:
                            await slot.back()
                        yield Done(outcome)
                        return
                    asked_again = True  # an empty answer is asked again once, outside the attempts
                    attempt = Attempt(definition, attempt.number, "retry")
                    continue
                error = outcome
                if not outcome.retriable or attempt.number >= self._policy.attempts:
                    break
                await asyncio.sleep(self._policy.delay(outcome, attempt.number))
                attempt = Attempt(definition, attempt.number + 1, "retry")
            failed = attempt
        assert error is not None, "a chain has at least its primary model"
        if slot is not None:
            await slot.back()
        raise error


async def guarded(
    stream: AsyncIterator[StreamEvent], policy: Policy, timeout_s: float | None = None
) -> AsyncIterator[StreamEvent]:
    """`stream` with a first-chunk timeout (the model's `timeout_s` if set) and a stall timeout between chunks. Each
    wait is timed in the caller's own task (`asyncio.timeout`): no task per chunk, as `wait_for` makes on 3.11, and
    the time the caller spends between chunks is not counted."""
    iterator = aiter(stream)
    timeout = timeout_s or policy.first_chunk_timeout
    first = True
    try:
        while True:
            try:
                async with asyncio.timeout(timeout):
                    event = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                what = "sent nothing" if first else "stalled"
                raise ProviderError(
                    f"the model {what} for {timeout:g} s; the request was aborted", kind="timeout", retriable=True
                ) from exc
            yield event
            first = False
            timeout = policy.stall_timeout
    finally:
        await aclose(iterator)
