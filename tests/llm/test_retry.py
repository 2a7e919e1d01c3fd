"""`app.llm.retry`: backoff and Retry-After, stream timeouts, the fallback chain, and `FallbackModel` around models
of the `test` provider (no database: a recording `Attempts` stands in for the engine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from app.llm import retry
from app.llm.base import (
    CallContext,
    Done,
    LLMRequest,
    LLMResponse,
    Model,
    ProviderError,
    StreamEvent,
    TextDelta,
)
from app.llm.test import TestModel
from app.spec import ModelDefinition, define_model
from app.spec.messages import LLMMessage

REQUEST = LLMRequest(model="", messages=[LLMMessage("user", "hi")])
FAST = retry.Policy(backoff=0, first_chunk_timeout=5, stall_timeout=5)


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
        "a": define_model(name="a", provider="test", script=[], fallbacks=["b", "a", "c", "unknown"]),
        "b": define_model(name="b", provider="test", script=[]),
        "c": define_model(name="c", provider="test", script=[]),
    }
    assert [m.name for m in retry.chain(models, "a")] == ["a", "b", "c"]


class Recorder:
    """The engine's part, recorded: each model's requests counted (the `test` provider's script position)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []
        self.made: dict[str, int] = {}
        self.opened = asyncio.Event()

    async def open(
        self, attempt: retry.Attempt, request: LLMRequest, ctx: CallContext
    ) -> tuple[LLMRequest, CallContext]:
        name = attempt.model.name
        self.made[name] = self.made.get(name, 0) + 1
        self.seen.append(("open", name, attempt.number, attempt.follows))
        self.opened.set()
        return replace(request, model=name), replace(ctx, call_index=self.made[name] - 1)

    async def close(self, attempt: retry.Attempt, outcome: LLMResponse | ProviderError) -> None:
        said = outcome.text if isinstance(outcome, LLMResponse) else f"{outcome.kind}: {outcome.message}"
        self.seen.append(("close", attempt.model.name, said))

    async def fall_back(self, failed: retry.Attempt, to: ModelDefinition) -> None:
        self.seen.append(("fall_back", failed.model.name, failed.number, to.name))


def fallback(*definitions: ModelDefinition, policy: retry.Policy = FAST) -> tuple[retry.FallbackModel, Recorder]:
    recorder = Recorder()
    return retry.FallbackModel([(d, TestModel(d)) for d in definitions], policy, recorder), recorder


async def answer(model: Model) -> tuple[list[str], LLMResponse]:
    """The deltas' text and the final answer of one call."""
    events = await _collect(model.stream(REQUEST, CallContext("t", 0)))
    assert isinstance(events[-1], Done)
    return [e.text for e in events[:-1] if isinstance(e, TextDelta)], events[-1].response


async def test_a_retriable_error_is_tried_again_on_the_same_model() -> None:
    model, recorder = fallback(
        define_model(name="m", provider="test", script=[{"error": "overloaded", "status": 529}, "ok"], chunk_size=1)
    )
    deltas, response = await answer(model)
    assert (deltas, response.text) == (["o", "k"], "ok")
    assert recorder.seen == [
        ("open", "m", 1, None),
        ("close", "m", "server: overloaded"),
        ("open", "m", 2, "retry"),
        ("close", "m", "ok"),
    ]


async def test_a_final_error_skips_the_retry_and_the_next_model_may_accept() -> None:
    primary = define_model(name="m", provider="test", fallbacks=["b"], script=[{"error": "bad", "status": 400}])
    model, recorder = fallback(primary, define_model(name="b", provider="test", script=["from b"]))
    assert (await answer(model))[1].text == "from b"
    assert recorder.seen == [
        ("open", "m", 1, None),
        ("close", "m", "bad_request: bad"),
        ("fall_back", "m", 1, "b"),
        ("open", "b", 1, "fallback"),
        ("close", "b", "from b"),
    ]


async def test_when_every_model_fails_the_last_error_is_raised() -> None:
    failing = [{"error": "down", "status": 503}, {"error": "still down", "status": 503}]
    model, recorder = fallback(
        define_model(name="m", provider="test", script=failing), define_model(name="b", provider="test", script=failing)
    )
    with pytest.raises(ProviderError, match="still down"):
        await answer(model)
    assert [s[:3] for s in recorder.seen if s[0] != "close"] == [
        ("open", "m", 1),
        ("open", "m", 2),
        ("fall_back", "m", 2),
        ("open", "b", 1),
        ("open", "b", 2),
    ]


async def test_an_empty_answer_is_asked_again_once_per_call() -> None:
    model, recorder = fallback(define_model(name="m", provider="test", script=["", "  ", "never"]))
    assert (await answer(model))[1].text == "  "  # the second empty answer is taken
    assert [s for s in recorder.seen if s[0] == "open"] == [("open", "m", 1, None), ("open", "m", 1, "retry")]
    # across the chain: after a re-ask, the next model's empty answer is taken too
    primary = define_model(name="m", provider="test", script=["", {"error": "bad", "status": 400}])
    model, recorder = fallback(primary, define_model(name="b", provider="test", script=["", "never"]))
    assert (await answer(model))[1].text == ""
    assert [s[1:] for s in recorder.seen if s[0] == "open"] == [("m", 1, None), ("m", 1, "retry"), ("b", 1, "fallback")]


class Limited:
    """A model that is rate limited once, with a `Retry-After`, then answers."""

    provider = "limited"

    def __init__(self, retry_after: float) -> None:
        self.retry_after = retry_after
        self.calls = 0

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        if self.calls == 1:
            raise ProviderError("slow down", kind="rate_limited", retriable=True, retry_after=self.retry_after)
        yield Done(LLMResponse(text="ok"))


@pytest.mark.parametrize(("retry_after", "max_delay"), [(0.05, 10.0), (3600.0, 0.05)])
async def test_the_retry_waits_for_retry_after_up_to_the_cap(retry_after: float, max_delay: float) -> None:
    definition = define_model(name="m", provider="test", script=[])
    policy = retry.Policy(backoff=10, max_delay=max_delay)
    model = retry.FallbackModel([(definition, Limited(retry_after))], policy, Recorder())
    started = time.monotonic()
    assert (await answer(model))[1].text == "ok"
    assert time.monotonic() - started >= 0.05


async def test_a_model_that_sends_nothing_is_aborted_by_its_own_timeout_and_retried() -> None:
    slow = define_model(name="m", provider="test", script=["late", "late"], delay_ms=2000, timeout_s=0.05)
    model, recorder = fallback(slow)
    with pytest.raises(ProviderError, match=r"sent nothing for 0\.05 s") as caught:
        await answer(model)
    assert caught.value.kind == "timeout" and recorder.made == {"m": 2}


class Truncated:
    """A model whose stream ends without its final response."""

    provider = "truncated"

    async def stream(self, request: LLMRequest, ctx: CallContext) -> AsyncIterator[StreamEvent]:
        yield TextDelta("cut")


async def test_a_stream_without_a_final_response_is_a_retriable_stream_error() -> None:
    definition = define_model(name="m", provider="test", script=[])
    recorder = Recorder()
    with pytest.raises(ProviderError, match="the stream ended without a final response") as caught:
        await answer(retry.FallbackModel([(definition, Truncated())], FAST, recorder))
    assert (caught.value.kind, caught.value.retriable, recorder.made) == ("stream", True, {"m": 2})


async def test_a_cancelled_call_never_walks_the_chain() -> None:
    slow = define_model(name="m", provider="test", fallbacks=["b"], script=["slow"], delay_ms=5000)
    model, recorder = fallback(slow, define_model(name="b", provider="test", script=["from b"]))
    task = asyncio.create_task(answer(model))
    await recorder.opened.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.seen == [("open", "m", 1, None)]  # no outcome recorded, no fallback
