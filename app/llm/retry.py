"""Resilience around any `Model`: first-chunk and stall timeouts, retries with backoff, the fallback chain.

Two attempts per model (a retriable error is tried again after an exponential backoff, or the provider's
`Retry-After`), then each of the model's `fallbacks` in order. A final error (a bad request, a refused key) is not
tried again on the same model, but the next model of the chain may still accept the request. A user stop cancels
the task: `CancelledError` is never caught here, so a stop never walks the chain.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from app.catalog import Catalog
from app.llm.base import ProviderError, StreamEvent
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


def chain(catalog: Catalog, primary: str) -> list[ModelDefinition]:
    """The model and its fallbacks, in the order they are tried (each model once)."""
    out: list[ModelDefinition] = []
    for name in [primary, *catalog.models[primary].fallbacks]:
        definition = catalog.models.get(name)
        if definition is not None and definition not in out:
            out.append(definition)
    return out


async def guarded(
    stream: AsyncIterator[StreamEvent], policy: Policy, timeout_s: float | None = None
) -> AsyncIterator[StreamEvent]:
    """`stream` with a first-chunk timeout (the model's `timeout_s` if set) and a stall timeout between chunks."""
    iterator = aiter(stream)
    timeout = timeout_s or policy.first_chunk_timeout
    first = True
    try:
        while True:
            try:
                event = await asyncio.wait_for(anext(iterator), timeout)
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
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
