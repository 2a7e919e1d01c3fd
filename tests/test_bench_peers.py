"""The peer benchmark's own pieces (bench/peers/), without Aegra: B4's model server as our real `openai` provider
reads it, and the client's summaries and tables on a small fixture."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app import llm
from app.llm.base import CallContext, Done, LLMRequest, LLMResponse, LLMTool, ProviderError, TextDelta
from app.spec import define_model
from app.spec.messages import LLMMessage
from bench.peers import compare, summarize
from bench.peers.adapters import MARKER, RunTiming
from bench.peers.bench_client import _stream_figures, ms_summary, pct
from bench.peers.fake_llm import Fake, serve

TTFT_MS, CHUNKS, INTERVAL_MS = 40.0, 4, 10.0
QUERY = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}  # as pydantic writes it
LOOKUP = LLMTool("lookup_slow", "Look a fact up (slowly).", QUERY)


@pytest.fixture
async def fake_url() -> AsyncIterator[str]:
    """fake_llm.py on a free loopback port, in this process; its base URL as a model's `base_url`."""
    server = await serve(Fake(ttft_ms=TTFT_MS, chunks=CHUNKS, interval_ms=INTERVAL_MS, tool_calls=3), 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        await server.wait_closed()


async def ask(base_url: str, request: LLMRequest) -> tuple[list[str], LLMResponse, float]:
    """One call through the `openai` provider: the text deltas, the final response, the seconds it took."""
    definition = define_model(name="fakeapi", provider="openai", model="fake", base_url=base_url)
    async with httpx.AsyncClient(timeout=10) as http:
        model = llm.build(definition, http)
        deltas: list[str] = []
        done: LLMResponse | None = None
        started = time.perf_counter()
        async for event in model.stream(request, CallContext(thread_id="t", call_index=0)):
            if isinstance(event, TextDelta):
                deltas.append(event.text)
            elif isinstance(event, Done):
                done = event.response
        assert done is not None
        return deltas, done, time.perf_counter() - started


async def test_the_fake_model_asks_for_its_tool_calls_and_then_streams_timestamped_text(fake_url: str) -> None:
    ping = LLMMessage("user", "ping")
    request = LLMRequest(model="fake", messages=[ping], tools=[LOOKUP], parallel_tool_calls=True)
    deltas, answer, took = await ask(fake_url, request)

    assert deltas == []
    assert answer.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in answer.tool_calls] == ["lookup_slow"] * 3
    assert [json.loads(c["function"]["arguments"]) for c in answer.tool_calls] == [{"q": "answer"}] * 3
    assert len({c["id"] for c in answer.tool_calls}) == 3
    assert answer.usage.input_tokens > 0
    assert answer.usage.output_tokens == 4 * CHUNKS
    assert took >= (TTFT_MS + CHUNKS * INTERVAL_MS) / 1000 * 0.95  # the model's latency is real

    results = [LLMMessage("tool", "42", tool_call_id=c["id"], name="lookup_slow") for c in answer.tool_calls]
    history = [ping, LLMMessage("assistant", None, tool_calls=answer.tool_calls), *results]
    sent = time.time()
    deltas, answer, took = await ask(fake_url, LLMRequest(model="fake", messages=history, tools=[LOOKUP]))

    assert answer.finish_reason == "stop"
    assert answer.tool_calls == []
    assert "".join(deltas) == answer.text
    assert [d.split("⟩ ", 1)[1] for d in deltas] == [f"tok{i} " for i in range(CHUNKS)]
    stamps = [float(ts) for ts in MARKER.findall(answer.text)]  # what bench_client measures chunk lag from
    assert len(stamps) == CHUNKS
    assert stamps == sorted(stamps)
    # chunk i leaves no sooner than TTFT + i x interval after the request (later on a busy machine)
    assert sent + TTFT_MS / 1000 * 0.9 <= stamps[0] <= stamps[-1] <= time.time()
    assert stamps[-1] >= sent + (TTFT_MS + (CHUNKS - 1) * INTERVAL_MS) / 1000 * 0.9


async def test_the_fake_model_asks_for_one_call_when_parallel_calls_are_off(fake_url: str) -> None:
    request = LLMRequest(model="fake", messages=[LLMMessage("user", "ping")], tools=[LOOKUP], parallel_tool_calls=False)
    _, answer, _ = await ask(fake_url, request)
    assert len(answer.tool_calls) == 1
    async with httpx.AsyncClient(base_url=fake_url.removesuffix("/v1")) as http:
        stats = (await http.get("/stats")).json()
        config = (await http.get("/config")).json()
    assert stats["parallel_false"] == 1
    assert stats["requests"] == stats["tool_answers"] == 1
    assert config["call_ms"] == pytest.approx(TTFT_MS + CHUNKS * INTERVAL_MS)


async def test_a_user_message_can_name_the_calls_and_their_arguments_follow_each_tools_schema(fake_url: str) -> None:
    child = LLMTool("child", "a subagent", {"type": "object", "properties": {"message": {"type": "string"}},
                                             "required": ["message"]})  # fmt: skip
    work = LLMTool("work", "no arguments", {"type": "object", "properties": {}})
    asked = LLMMessage("user", "call:child,work please")
    registry = LLMMessage("system", "Subagents of this thread: …")  # what our runtime appends once there are some
    request = LLMRequest(model="fake", messages=[asked, registry], tools=[work, child, LOOKUP])
    _, answer, _ = await ask(fake_url, request)
    assert [c["function"]["name"] for c in answer.tool_calls] == ["child", "work"]
    assert [json.loads(c["function"]["arguments"]) for c in answer.tool_calls] == [{"message": "answer"}, {}]
    with pytest.raises(ProviderError) as caught:
        await ask(fake_url, LLMRequest(model="fake", messages=[LLMMessage("user", "call:nope")], tools=[work]))
    assert "`nope`" in caught.value.message


async def test_a_request_without_the_fake_models_tool_fails_loudly(fake_url: str) -> None:
    other = LLMTool("lookup", "instant", {"type": "object", "properties": {}})
    request = LLMRequest(model="fake", messages=[LLMMessage("user", "ping")], tools=[other])
    with pytest.raises(ProviderError) as caught:
        await ask(fake_url, request)
    assert caught.value.kind == "bad_request"
    assert "lookup_slow" in caught.value.message


async def test_a_non_streaming_request_gets_the_whole_answer_at_once(fake_url: str) -> None:
    body = {"model": "fake", "stream": False, "messages": [{"role": "user", "content": "ping"}]}
    async with httpx.AsyncClient(timeout=10) as http:
        reply = (await http.post(f"{fake_url}/chat/completions", json=body)).json()
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert len(MARKER.findall(reply["choices"][0]["message"]["content"])) == CHUNKS


def test_the_clients_percentiles_and_summary() -> None:
    xs = [0.004, 0.001, 0.003, 0.002]
    assert pct(xs, 50) == pytest.approx(0.0025)
    assert pct(xs, 100) == 0.004
    assert pct([], 50) is None
    assert ms_summary(xs) == {"n": 4, "p50_ms": 2.5, "p90_ms": 3.7, "p99_ms": 3.97, "max_ms": 4.0, "mean_ms": 2.5}
    assert ms_summary([])["p50_ms"] is None


def test_chunk_lag_counts_each_marker_once_raw_or_json_escaped() -> None:
    t = RunTiming()
    now = time.perf_counter()
    wall = time.time()
    t.mark(json.dumps({"delta": f"⟨{wall - 0.5:.4f}⟩ tok0 "}), now)  # JSON-escaped (\u27e8)
    t.mark(f"⟨{wall - 0.5:.4f}⟩ tok0 ⟨{wall - 0.25:.4f}⟩ tok1 ", now)  # raw; tok0 again
    t.mark("no marker here", now)
    assert len(t.lags) == 2
    assert t.lags[0] == pytest.approx(0.5, abs=0.01)
    assert t.lags[1] == pytest.approx(0.25, abs=0.01)


def test_b4_figures_are_the_run_time_over_the_ideal_and_the_models_counters() -> None:
    config = {"call_ms": 1100.0}
    res = {"run_latency": {"p50_ms": 3000.0, "p99_ms": 4000.0}}
    before = {"requests": 10, "tool_answers": 5, "max_in_flight": 3}
    after = {"requests": 50, "tool_answers": 25, "max_in_flight": 40}
    out = _stream_figures(res, config, before, after, tool_s=0.5)
    assert out["ideal_run_ms"] == 2700.0
    assert (out["overhead_p50_ms"], out["overhead_p99_ms"]) == (300.0, 1300.0)
    assert out["llm_counts"]["requests"] == 40
    assert out["llm_counts"]["tool_answers"] == 20
    assert out["llm_counts"]["max_in_flight_ever"] == 40


def resources(server_cores: float, postgres_cores: float) -> dict[str, Any]:
    one = {"mem_mb_max": 100.0, "mem_mb_median": 90.0, "cpu_cores": server_cores, "cpu_s": 1.0}
    return {"server": one, "postgres": {**one, "cpu_cores": postgres_cores}, "client": {**one, "cpu_cores": 0.1}}


def b2_row(label: str, runs_per_s: float, server_cores: float) -> dict[str, Any]:
    b2 = {
        "clients": 50,
        "duration_s": 20,
        "completed_runs": int(runs_per_s * 20),
        "completed_in_drain": 0,
        "runs_per_s": runs_per_s,
        "llm_steps_per_s": 2 * runs_per_s,
        "errors": 0,
        "unfinished_at_drain": 0,
        "run_latency": {"p50_ms": 100.0, "p99_ms": 200.0},
    }
    return {
        "label": label,
        "test": "b2",
        "path": "events",
        "graph": "tool",
        "server": label,
        "b2": b2,
        "resources": resources(server_cores, 0.2),
    }


def b1_row(label: str, first_output_ms: float) -> dict[str, Any]:
    lat = {"n": 50, "p50_ms": first_output_ms, "p99_ms": 2 * first_output_ms}
    b1 = {"ack": lat, "first_output": lat, "done": lat, "errors": 0}
    return {"label": label, "test": "b1", "path": "stream", "graph": "tool", "b1": b1, "resources": resources(0.5, 0.1)}


FIXTURE = [
    b1_row("sa", 10.0),
    b1_row("local", 40.0),
    b2_row("sa", 60.0, 0.6),
    b2_row("sa", 80.0, 0.8),  # a second repetition: the tables show medians
    b2_row("local", 14.0, 0.8),
]


def test_the_summary_gives_medians_over_repetitions(capsys: pytest.CaptureFixture[str]) -> None:
    summarize.tables(FIXTURE)
    out = capsys.readouterr().out
    # medians of the repetitions: runs/s 60 and 80; server CPU ms per LLM step 5 and 5; with Postgres 6.67 and 6.25
    assert "| sa | tool | 50 | 2 | 70.0 (60–80) | 140.0 | 100.0 | 200.0 | 0.7 | 5.0 | 6.46 |" in out
    assert "| local | tool | 50 | 1 | 14.0 | 28.0 |" in out


def test_the_comparison_gives_the_ratios_of_the_medians(capsys: pytest.CaptureFixture[str]) -> None:
    compare.tables(FIXTURE, [("sa", "local")])
    out = capsys.readouterr().out
    assert "| B2 tool 50 clients, runs/s | 5.00 (70.0 vs 14.0) |" in out
    assert "| B1 tool first output p50 | 0.25 (10.0 vs 40.0 ms) |" in out


def test_the_span_reader_times_each_phase_of_a_b4_turn() -> None:
    """`bench/peers/spans.py` reads what OpenTelemetry's console exporter prints (here made by the SDK itself, between
    log lines) and times the phases of one B4 turn; a trace of another shape is left out."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.trace import set_span_in_context

    from bench.peers import spans

    tracer = TracerProvider().get_tracer("t")
    base = 1_700_000_000_000_000_000
    ms = 1_000_000

    def turn(tools: int = 3) -> list[str]:
        out = []
        post = tracer.start_span("POST /threads/{thread_id}/messages", start_time=base)
        ctx = set_span_in_context(post)
        timeline = [("execute", 5, 2735), ("step 1", 8, 1620), ("chat fake", 8, 1110)]
        timeline += [("execute_tool lookup_slow", 1113 + i, 1613) for i in range(tools)]
        timeline += [("step 2", 1620, 2733), ("chat fake", 1620, 2725)]
        for span_name, start, end in timeline:
            span = tracer.start_span(span_name, context=ctx, start_time=base + start * ms)
            span.end(end_time=base + end * ms)
            assert isinstance(span, ReadableSpan)  # the SDK's: what the console exporter prints
            out.append(span.to_json(indent=4))
        post.end(end_time=base + 3 * ms)
        assert isinstance(post, ReadableSpan)
        return [*out, post.to_json(indent=4)]

    text = "\n".join(["INFO app: started", *turn(), "INFO app.engine.run: turn ended", *turn(tools=0)])
    found = spans.spans(text)
    assert len(found) == 9 + 6  # the second trace has no tool: not a B4 turn
    measured = spans.phases(found)
    assert {name: [round(v, 1) for v in values] for name, values in measured.items()} == {
        "POST → its execution starts (the claim)": [5.0],
        "execution → step 1 (the opening)": [3.0],
        "model call 1": [1102.0],
        "answer 1 → first tool starts (the close)": [3.0],
        "the tools, first start → last end": [500.0],
        "last tool → step 2 (results, next opening)": [7.0],
        "model call 2": [1105.0],
        "answer 2 → execution ends (the close)": [10.0],
        "POST → execution ends": [2735.0],
    }
    assert "| model call 1 | 1102.0 | 1102.0 | 1102.0 |" in spans.table(measured)
