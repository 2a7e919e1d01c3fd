"""Traces (`app/tracing.py`): a tool turn as one tree from the POST to the tool, the trace carried through the queue,
the GenAI attributes, no secret or content in any span; off by default; and once at a real OTLP/HTTP receiver with
`agents api` and `agents worker` as processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text as sql

from app import tracing
from app.spec import StateMessage, ThreadState, define_hook
from tests import test_hooks as hooks_test
from tests.conftest import ROOT, client_for
from tests.processes import free_port, start, stop, until_ready
from tests.test_engine import catalog, settle
from tests.test_hooks import catalog as hooks_catalog

SECRET = "s3cr3t-val"
QUESTION = "what is 2+3, my dear model?"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans recorded in memory for the test (a provider of its own, installed and removed around it)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider.get_tracer("test"))
    try:
        yield exporter
    finally:
        tracing.install(None)
        provider.shutdown()


def one(found: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    named = [s for s in found if s.name == name]
    assert len(named) == 1, (name, [s.name for s in found])
    return named[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    found: int = span.context.span_id
    return found


def everything_said(found: Sequence[ReadableSpan]) -> str:
    """Every attribute and event of these spans, as text."""
    said = []
    for s in found:
        said += [s.name, repr(dict(s.attributes or {}))]
        said += [f"{e.name} {dict(e.attributes or {})!r}" for e in s.events]
    return "\n".join(said)


async def tool_turn(app_factory: Any, drive: Any) -> tuple[httpx.AsyncClient, str]:
    """A thread with a secret posts one message (with a `traceparent`): a 503 first, then a tool call, then a reply."""
    script = [
        {"error": f"busy ({SECRET})", "status": 503},
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
        "It is 5.",
    ]
    app = await app_factory(catalog(script))
    client = client_for(app)
    body = {"agent": "agent", "env": {"TOKEN": SECRET}, "secrets": ["TOKEN"]}
    tid = (await client.post("/threads", json=body)).json()["id"]
    posted = await client.post(
        f"/threads/{tid}/messages", json={"content": QUESTION}, headers={"traceparent": TRACEPARENT}
    )
    assert posted.status_code == 202
    await drive(app)
    await settle(client, tid)
    return client, tid


async def test_a_tool_turn_is_one_trace_from_the_post_to_the_tool(
    app_factory: Any, drive: Any, spans: InMemorySpanExporter
) -> None:
    await tool_turn(app_factory, drive)
    found = spans.get_finished_spans()
    post = one(found, "POST /threads/{thread_id}/messages")
    wait, execution = one(found, "queue.wait"), one(found, "execute")
    first, second = one(found, "step 1"), one(found, "step 2")
    chats = [s for s in found if s.name == "chat m"]
    tool = one(found, "execute_tool add")
    # one trace: the caller's, through the request, the queue and the execution
    assert post.context is not None and post.context.trace_id == int(TRACE_ID, 16)
    turn = [post, wait, execution, first, second, *chats, tool]
    assert {s.context.trace_id for s in turn if s.context is not None} == {int(TRACE_ID, 16)}
    assert parent_of(post) == 0x00F067AA0BA902B7  # the caller's span
    assert parent_of(wait) == parent_of(execution) == span_id(post)
    assert parent_of(first) == parent_of(second) == span_id(execution)
    assert [parent_of(c) for c in chats] == [span_id(first), span_id(second)]
    assert parent_of(tool) == span_id(first)
    assert wait.attributes is not None and float(str(wait.attributes["agents.queue.wait_ms"])) >= 0
    assert post.attributes is not None and post.attributes["http.response.status_code"] == 202
    assert post.attributes["http.route"] == "/threads/{thread_id}/messages"
    # the model call: GenAI attributes, token counts, the retry as an event
    chat = dict(chats[0].attributes or {})
    assert chat["gen_ai.system"] == "test" and chat["gen_ai.request.model"] == "m"
    assert chat["gen_ai.operation.name"] == "chat"
    assert int(str(chat["gen_ai.usage.input_tokens"])) > 0 and int(str(chat["gen_ai.usage.output_tokens"])) >= 0
    assert chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert [e.name for e in chats[0].events] == ["gen_ai.retry"]
    assert dict(chats[1].attributes or {})["gen_ai.response.finish_reasons"] == ("stop",)
    tool_attributes = dict(tool.attributes or {})
    assert tool_attributes["gen_ai.tool.name"] == "add" and tool_attributes["agents.tool.status"] == "success"
    assert str(tool_attributes["gen_ai.tool.call.id"])
    # nothing secret, nothing said: neither the message, the answer, the tool's result nor the provider's error
    said = everything_said(found)
    for hidden in (SECRET, QUESTION, "It is 5.", "busy"):
        assert hidden not in said


async def test_a_worker_continues_the_trace_of_the_post(app_factory: Any, spans: InMemorySpanExporter) -> None:
    cat = catalog([{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}, "5"])
    app = await app_factory(cat)
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    worker = await app_factory(cat, with_worker=True)  # another runtime: the API's context only via the inbox
    assert worker is not app
    await client.post(f"/threads/{tid}/messages", json={"content": "2+3?"}, headers={"traceparent": TRACEPARENT})
    await settle(client, tid)
    found = spans.get_finished_spans()
    post = one(found, "POST /threads/{thread_id}/messages")
    execution, tool = one(found, "execute"), one(found, "execute_tool add")
    assert parent_of(execution) == span_id(post)
    assert {s.context.trace_id for s in (post, execution, tool) if s.context is not None} == {int(TRACE_ID, 16)}


async def test_messages_posted_before_one_execution_are_linked_to_it(
    app_factory: Any, drive: Any, spans: InMemorySpanExporter
) -> None:
    app = await app_factory(catalog(["both read"]))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "one"}, headers={"traceparent": TRACEPARENT})
    await client.post(f"/threads/{tid}/messages", json={"content": "two"})  # a trace of its own
    await drive(app)
    await settle(client, tid)
    found = spans.get_finished_spans()
    first, second = [s for s in found if s.name == "POST /threads/{thread_id}/messages"]
    execution = one(found, "execute")
    assert parent_of(execution) == span_id(first) and parent_of(one(found, "queue.wait")) == span_id(first)
    assert [link.context.span_id for link in execution.links] == [span_id(second)]
    assert second.context is not None and second.context.trace_id != int(TRACE_ID, 16)


async def test_contents_go_into_spans_only_when_allowed_and_secrets_never(
    app_factory: Any, drive: Any, spans: InMemorySpanExporter
) -> None:
    tracer = tracing._tracer
    tracing.install(tracer, capture_content=True)
    await tool_turn(app_factory, drive)
    chat = [s for s in spans.get_finished_spans() if s.name == "chat m"][1]
    assert [(e.name, dict(e.attributes or {})["content"]) for e in chat.events] == [("gen_ai.choice", "It is 5.")]
    assert SECRET not in everything_said(spans.get_finished_spans())


async def test_a_failing_hook_has_a_span_marked_failed_without_its_message(
    app_factory: Any, drive: Any, spans: InMemorySpanExporter
) -> None:
    @define_hook("filter_messages")
    async def broken(state: ThreadState, messages: list[StateMessage]) -> list[StateMessage]:
        raise RuntimeError(f"leaks {SECRET}")

    app = await app_factory(hooks_catalog(hooks_test.Model("hello"), [broken]))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
    await drive(app)
    await settle(client, tid)
    hook = one(spans.get_finished_spans(), "hook filter_messages")
    assert dict(hook.attributes or {}) == {
        "agents.hook.name": "broken",
        "agents.hook.type": "filter_messages",
        "error.type": "RuntimeError",
    }
    assert hook.status.description is None and SECRET not in everything_said(spans.get_finished_spans())


async def queued_payloads(app_factory: Any) -> list[dict[str, Any]]:
    """The inbox payload of a message posted to a new thread (not run)."""
    app = await app_factory(catalog(["hi"]))
    client = client_for(app)
    tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
    assert (await client.post(f"/threads/{tid}/messages", json={"content": "hi"})).status_code == 202
    async with app.state.runtime.sessions() as session:
        return list((await session.execute(sql("SELECT payload FROM inbox ORDER BY id"))).scalars())


async def test_off_by_default_nothing_is_carried(app_factory: Any) -> None:
    assert not tracing.enabled()
    assert tracing.span("x") is tracing.span("y")  # one shared no-op: nothing is made per call
    assert [tracing.CARRIER in p for p in await queued_payloads(app_factory)] == [False]


async def test_on_the_posting_request_is_carried_in_the_inbox(app_factory: Any, spans: InMemorySpanExporter) -> None:
    [payload] = await queued_payloads(app_factory)
    post = one(spans.get_finished_spans(), "POST /threads/{thread_id}/messages")
    assert post.context is not None
    trace_id, span_id = f"{post.context.trace_id:032x}", f"{post.context.span_id:016x}"
    assert payload[tracing.CARRIER]["traceparent"].startswith(f"00-{trace_id}-{span_id}-")  # then its flags


def test_off_costs_a_global_read() -> None:
    """The helpers the hot path calls, with traces off, against an empty `with`: well under a microsecond each."""
    assert not tracing.enabled()
    rounds = 100_000
    begun = time.perf_counter()
    for _ in range(rounds):
        with tracing.span("step", {"agents.step": 1}):
            pass
        tracing.event("gen_ai.retry")
    spent = (time.perf_counter() - begun) / rounds
    assert spent < 5e-6, spent


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ],
)
def test_the_otel_variables_turn_traces_on(environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(environ) is on


def test_started_installs_a_provider_and_stops_it() -> None:
    environ = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "svc"}
    with tracing.started(environ):
        assert tracing.enabled() and not tracing.content()
    assert not tracing.enabled()
    with tracing.started({}):
        assert not tracing.enabled()


# -- a real OTLP/HTTP receiver ------------------------------------------------------------------------------


@contextlib.contextmanager
def receiver() -> Iterator[tuple[int, list[ExportTraceServiceRequest]]]:
    """An OTLP/HTTP endpoint on a free port: each `POST /v1/traces` decoded into the list it yields."""
    received: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received.append(request)
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def exported(received: list[ExportTraceServiceRequest]) -> list[tuple[str, str, bytes, bytes, bytes]]:
    """(service name, span name, trace id, span id, parent span id) of every span received."""
    out = []
    for request in received:
        for resource in request.resource_spans:
            service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
            for scope in resource.scope_spans:
                out += [(service, s.name, s.trace_id, s.span_id, s.parent_span_id) for s in scope.spans]
    return out


@pytest.mark.slow
async def test_api_and_worker_export_one_trace_to_an_otlp_receiver(database_url: str, tmp_path: Path) -> None:
    with receiver() as (collector, received):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
        env |= {
            "DATABASE_URL": database_url,
            "DATA_DIR": str(tmp_path / "data"),
            "AGENTS_DIR": str(ROOT / "agents"),
            "SECRET_KEY": "k" * 48,
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        api = start(["api", "--port", str(port)], {**env, "OTEL_SERVICE_NAME": "agents-api"}, tmp_path / "api.log")
        worker = start(["worker"], {**env, "OTEL_SERVICE_NAME": "agents-worker"}, tmp_path / "worker.log")
        base = f"http://127.0.0.1:{port}"
        try:
            await until_ready(base, api, tmp_path / "api.log")
            async with httpx.AsyncClient(base_url=base) as client:
                tid = (await client.post("/threads", json={"agent": "assistant"})).json()["id"]
                posted = await client.post(f"/threads/{tid}/messages", json={"content": "What is 12 * (3 + 4)?"})
                assert posted.status_code == 202

                async def ended() -> bool:
                    return bool((await client.get(f"/threads/{tid}")).json()["status"] == "idle")

                deadline = time.monotonic() + 30
                while not await ended():
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
                    await asyncio.sleep(0.1)
        finally:
            assert stop(worker) == 0, (tmp_path / "worker.log").read_text()  # flushes what is left
            assert stop(api) == 0, (tmp_path / "api.log").read_text()
        spans = exported(received)
    post = [s for s in spans if s[1] == "POST /threads/{thread_id}/messages"]
    assert len(post) == 1 and post[0][0] == "agents-api"
    _, _, trace_id, post_id, _ = post[0]
    turn = {(service, name): parent for service, name, trace, _, parent in spans if trace == trace_id}
    assert turn[("agents-worker", "queue.wait")] == turn[("agents-worker", "execute")] == post_id
    assert {("agents-worker", "step 1"), ("agents-worker", "execute_tool calculate")} <= set(turn)
    assert any(service == "agents-worker" and name.startswith("chat ") for service, name in turn)
