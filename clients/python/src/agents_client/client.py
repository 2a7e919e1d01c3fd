"""`Client` and `AsyncClient`: one surface, sent with a sync or an async httpx client. Every call is built by a
resource as a `Call`, sent here, and its error answer raised as an `APIError` (a dropped connection as a
`TransportError`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from agents_client import (
    agents,
    call,
    effects,
    endpoints,
    env,
    errors,
    files,
    messages,
    models,
    stream,
    threads,
    variables,
    version,
)
from agents_client.call import Call

T = TypeVar("T")

DEFAULT_URL = "http://localhost:8000"


def _headers(api_key: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    headers = {"User-Agent": f"standard-agents-client-python/{version.VERSION}", **(extra or {})}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _request(http: httpx.Client | httpx.AsyncClient, sent: Call[Any], timeout: float) -> httpx.Request:
    return http.build_request(
        sent.method,
        sent.path,
        params=sent.params,
        json=sent.json,
        content=sent.content,
        data=sent.data,
        files=sent.files,
        headers=sent.headers,
        timeout=httpx.Timeout(timeout, read=sent.timeout) if sent.timeout else httpx.USE_CLIENT_DEFAULT,
    )


def _read(sent: Call[T], response: httpx.Response) -> T:
    if response.status_code >= 400:
        raise errors.from_response(response.status_code, response.content, response.headers)
    return sent.read(response)


def _health() -> Call[models.Health]:
    return Call("GET", "/health", call.model(models.Health))


class Client:
    """The API of the server at `base_url`, with `api_key` when the server has keys (none in open mode).

    `timeout` bounds each call (a `wait` on `messages.post` adds its own); streams reconnect `stream_retries`
    times in a row without an event before they raise, and count a connection idle for `stream_idle` seconds
    (the server pings every 15) as dropped. `transport` is httpx's (a `MockTransport` in tests)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        stream_retries: int = 8,
        stream_backoff: float = 0.25,
        stream_max_delay: float = 5.0,
        stream_idle: float = 45.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key, headers), timeout=timeout, transport=transport
        )
        options = stream.Options(stream_retries, stream_backoff, stream_max_delay, stream_idle)
        self.threads = threads.Threads(self._send)
        self.messages = messages.Messages(self._send)
        self.events = stream.Events(self._http, self._send, options)
        self.files = files.Files(self._send)
        self.effects = effects.Effects(self._send)
        self.variables = variables.Variables(self._send)
        self.endpoints = endpoints.Endpoints(self._send)
        self.agents = agents.Agents(self._send)
        self.env = env.Env(self._send)

    def _send(self, sent: Call[T]) -> T:
        request = _request(self._http, sent, self._timeout)
        try:
            response = self._http.send(request)
        except httpx.TransportError as exc:
            raise errors.from_transport(exc, request.method, str(request.url)) from exc
        return _read(sent, response)

    def health(self) -> models.Health:
        """`{"status": "ok"}` while the server runs (no key needed)."""
        return self._send(_health())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class AsyncClient:
    """`Client`'s surface, every call awaited and every stream an async iterator."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        stream_retries: int = 8,
        stream_backoff: float = 0.25,
        stream_max_delay: float = 5.0,
        stream_idle: float = 45.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key, headers), timeout=timeout, transport=transport
        )
        options = stream.Options(stream_retries, stream_backoff, stream_max_delay, stream_idle)
        self.threads = threads.AsyncThreads(self._send)
        self.messages = messages.AsyncMessages(self._send)
        self.events = stream.AsyncEvents(self._http, self._send, options)
        self.files = files.AsyncFiles(self._send)
        self.effects = effects.AsyncEffects(self._send)
        self.variables = variables.AsyncVariables(self._send)
        self.endpoints = endpoints.AsyncEndpoints(self._send)
        self.agents = agents.AsyncAgents(self._send)
        self.env = env.AsyncEnv(self._send)

    async def _send(self, sent: Call[T]) -> T:
        request = _request(self._http, sent, self._timeout)
        try:
            response = await self._http.send(request)
        except httpx.TransportError as exc:
            raise errors.from_transport(exc, request.method, str(request.url)) from exc
        return _read(sent, response)

    async def health(self) -> models.Health:
        """`{"status": "ok"}` while the server runs (no key needed)."""
        return await self._send(_health())

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
