"""OpenTelemetry traces: off unless the standard `OTEL_*` variables ask for them (`started`), and the span helpers the
API and the engine call. Off, a helper costs one global read and hands back a shared no-op context manager: no SDK
object is made per request.

On when `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`), or when it is unset and an OTLP endpoint is
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` keep it off. The SDK reads the rest itself (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`). Spans carry ids, names, counts and timings, never
a secret; message contents only with `OTEL_CAPTURE_CONTENT=true` (`content`), and then with known secrets masked.

A posted message carries its request's trace context in its inbox payload (`carrier`); the execution that delivers it
continues that trace (`resumed`), with a `queue.wait` span for the time the message waited to be claimed, and links
to the traces of the other messages it delivers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

SERVICE_NAME = "standard-agents"  # unless `OTEL_SERVICE_NAME` (or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) says
CARRIER = "trace"  # the inbox payload's key for the posting request's trace context

Attributes = Mapping[str, AttributeValue]

_tracer: Tracer | None = None
_content = False
_OFF: AbstractContextManager[None] = contextlib.nullcontext()  # reusable: what every helper returns when off
_propagator = TraceContextTextMapPropagator()  # W3C `traceparent`/`tracestate` only: no baggage rides along


def enabled() -> bool:
    """Whether spans are recorded in this process."""
    return _tracer is not None


def content() -> bool:
    """Whether message contents may go into spans (`OTEL_CAPTURE_CONTENT=true`)."""
    return _content


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether these variables turn traces on."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def install(tracer: Tracer | None, *, capture_content: bool = False) -> None:
    """Record spans with `tracer` (None: stop recording). `started` calls it; tests call it with their own provider."""
    global _tracer, _content
    _tracer, _content = tracer, capture_content and tracer is not None


@contextlib.contextmanager
def started(environ: Mapping[str, str] | None = None) -> Iterator[None]:
    """Traces for the process's lifetime when the `OTEL_*` variables ask for them; flushed and stopped on exit. A
    tracer already installed (a test's) is left as it is."""
    environ = os.environ if environ is None else environ
    if _tracer is not None or not wanted(environ):
        yield
        return
    provider = _provider(environ)
    install(provider.get_tracer("app"), capture_content=environ.get("OTEL_CAPTURE_CONTENT", "").lower() == "true")
    try:
        yield
    finally:
        install(None)
        provider.shutdown()  # the batch still queued is exported now


def _provider(environ: Mapping[str, str]) -> Any:
    """A `TracerProvider` exporting to what `OTEL_TRACES_EXPORTER` names (OTLP over HTTP when only an endpoint is)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]
    for name in names:
        exporter: SpanExporter
        if name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            if protocol not in (None, "", "http/protobuf"):
                log.warning("OTLP protocol %r is not supported: traces are sent as http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()  # its endpoint, headers, timeout and compression from `OTEL_EXPORTER_OTLP_*`
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER %r: ignored (known: otlp, console, none)", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


# -- spans ---------------------------------------------------------------------------------------------------


def span(
    name: str,
    attributes: Attributes | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: Context | None = None,
    links: Sequence[Link] = (),
) -> AbstractContextManager[Span | None]:
    """A span around a block, current inside it (None when traces are off). An exception marks it failed with its
    type only: its message may hold contents or secrets."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    return _span(tracer, name, attributes, kind, context, links)


@contextlib.contextmanager
def _span(
    tracer: Tracer,
    name: str,
    attributes: Attributes | None,
    kind: SpanKind,
    context: Context | None,
    links: Sequence[Link] = (),
) -> Iterator[Span]:
    with tracer.start_as_current_span(
        name, context, kind, attributes, links, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as exc:
            failed(current, type(exc).__name__)
            raise


def failed(current: Span | None, kind: str) -> None:
    """Mark a span failed, saying only what kind of failure it was."""
    if current is not None:
        current.set_status(Status(StatusCode.ERROR))
        current.set_attribute("error.type", kind)


def event(name: str, attributes: Attributes | None = None) -> None:
    """An event on the current span (a retry, a fallback)."""
    if _tracer is not None:
        get_current_span().add_event(name, attributes)


# -- across the queue ----------------------------------------------------------------------------------------


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers, to store with what is queued; None when off or outside a trace."""
    if _tracer is None:
        return None
    found: dict[str, str] = {}
    _propagator.inject(found)
    return found or None


def resumed(queued: Sequence[tuple[Any, str | None]]) -> tuple[Context | None, list[Link]]:
    """What an execution continues: the context the oldest of these queued messages (`carrier`, when it was queued)
    was posted in, with a `queue.wait` span from its queuing to now, and links to the others' (posted before the
    execution began, delivered by it too); (None, []) when off or when nothing was carried."""
    tracer = _tracer
    if tracer is None:
        return None, []
    parent: Context | None = None
    links: list[Link] = []
    now = time.time_ns()
    for found, queued_at in queued:
        if not isinstance(found, dict) or not found:
            continue
        context = _propagator.extract({str(k): str(v) for k, v in found.items()})
        posted = get_current_span(context).get_span_context()
        if not posted.is_valid:
            continue
        if parent is not None:
            links.append(Link(posted))
            continue
        parent, start = context, now
        if queued_at:
            with contextlib.suppress(ValueError):
                start = min(now, int(datetime.fromisoformat(queued_at).timestamp() * 1e9))
        attributes = {"agents.queue.wait_ms": (now - start) / 1e6}
        tracer.start_span("queue.wait", context, SpanKind.CONSUMER, attributes, start_time=start).end(now)
    return parent, links


# -- HTTP ----------------------------------------------------------------------------------------------------


class Middleware:
    """A server span per HTTP request, a child of the caller's `traceparent` when it sent one: its method, route
    template and status (never its query string, headers or body). Off, it only passes the request on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracer = _tracer
        if tracer is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope["headers"]
            if key in (b"traceparent", b"tracestate")
        }
        method = scope["method"]
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        attributes = {"http.request.method": method, "url.path": scope["path"]}
        with _span(tracer, method, attributes, SpanKind.SERVER, _propagator.extract(headers)) as current:
            try:
                await self.app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    current.update_name(f"{method} {route}")
                    current.set_attribute("http.route", route)
                if status:
                    current.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        failed(current, str(status))
