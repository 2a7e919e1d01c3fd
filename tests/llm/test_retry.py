"""`app.llm.retry`: backoff and Retry-After, stream timeouts, the fallback chain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.catalog import Catalog
from app.llm import retry
from app.llm.base import Done, LLMResponse, ProviderError, StreamEvent, TextDelta
from app.spec import define_model


def test_backoff_doubles_and_retry_after_wins_up_to_the_cap() -> None:
    policy = retry.Policy(backoff=0.5, max_delay=10)
    plain = ProviderError("busy", retriable=True)
    assert [policy.delay(plain, n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert policy.delay(ProviderError("slow down", retriable=True, retry_after=7), 1) == 7
    assert policy.delay(ProviderError("slow down", retriable=True, retry_after=3600), 1) == 10


async def _chunks(*pauses: float) -> AsyncIterator[StreamEvent]:
    for pause in pauses:
        await asyncio.sleep(pause)
        yield TextDelta("x")
    yield Done(LLMResponse(text="x" * len(pauses)))


async def _collect(stream: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in stream]


async def test_a_healthy_stream_passes_through() -> None:
    events = await _collect(retry.guarded(_chunks(0, 0.01, 0.01), retry.Policy(first_chunk_timeout=1, stall_timeout=1)))
    assert len(events) == 4 and isinstance(events[-1], Done)


async def test_a_stream_that_never_starts_times_out() -> None:
    with pytest.raises(ProviderError) as caught:
        await _collect(retry.guarded(_chunks(5), retry.Policy(first_chunk_timeout=0.05)))
    assert caught.value.kind == "timeout" and caught.value.retriable
    assert "sent nothing for 0.05 s" in caught.value.message


async def test_the_model_timeout_replaces_the_first_chunk_timeout() -> None:
    events = await _collect(retry.guarded(_chunks(0.1), retry.Policy(first_chunk_timeout=0.01), timeout_s=1))
    assert len(events) == 2


async def test_a_stream_that_stalls_midway_is_aborted() -> None:
    with pytest.raises(ProviderError) as caught:
        await _collect(retry.guarded(_chunks(0, 5), retry.Policy(first_chunk_timeout=1, stall_timeout=0.05)))
    assert "stalled for 0.05 s" in caught.value.message


def test_the_chain_is_the_model_then_its_fallbacks_once_each() -> None:
    models = {
        "a": define_model(name="a", provider="test", script=[], fallbacks=["b", "a", "c"]),
        "b": define_model(name="b", provider="test", script=[]),
        "c": define_model(name="c", provider="test", script=[]),
    }
    cat = Catalog(root=Path("."), models=models, prompts={}, agents={}, tools={})
    assert [m.name for m in retry.chain(cat, "a")] == ["a", "b", "c"]
