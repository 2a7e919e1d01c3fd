"""The provider adapters' HTTP/1.1 connections: asyncio protocols, responses parsed by httptools (llhttp, in C).

httpx's own transport (httpcore over anyio, responses parsed by h11 in Python) cost a B4 server more CPU than the
model's streams themselves: about a sixth of its samples at 40 clients, in the pool's walks over its connections,
anyio's stream layers and h11's parsing, per chunk of every stream. `Transport` is what the adapters need and no
more: HTTP/1.1 to an origin (http or https), the request sent in one write, the response's body handed on a read at
a time (everything that arrived since the last one, in one piece), kept-alive connections reused most recently used
first and dropped when the server closes them or after `KEEPALIVE_SECONDS` idle. It sits under `httpx.AsyncClient`,
which still builds requests, decodes content encodings and routes proxied origins through its own transports. What
it does not handle (another HTTP version, `HEAD`, an `Upgrade`) goes to httpx's transport unchanged.

Errors are httpx's, as httpcore raises them: `ConnectError` / `ConnectTimeout` before a connection is open,
`WriteError` / `WriteTimeout` while sending, `ReadError` / `ReadTimeout` / `RemoteProtocolError` while reading.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httptools
import httpx

KEEPALIVE_SECONDS = 5.0  # an idle connection older than this is closed, not reused (httpx's default expiry)
HIGH_WATER = 1 << 20  # bytes of a body read ahead of the reader before the socket is paused

Origin = tuple[str, str, int]  # scheme, host, port


class Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 connections per origin, kept alive; `verify`: an `ssl.SSLContext` for https (httpx's default one
    if not given). `fallback` (httpx's transport, made on first use) takes what this one does not handle."""

    def __init__(self, verify: ssl.SSLContext | None = None, fallback: httpx.AsyncBaseTransport | None = None) -> None:
        self._verify = verify
        self._fallback = fallback
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._busy: weakref.WeakSet[_Connection] = weakref.WeakSet()  # carrying a request or its response
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if request.method in ("HEAD", "CONNECT") or url.scheme not in ("http", "https") or "upgrade" in request.headers:
            return await self._other().handle_async_request(request)
        if self._closed:
            raise RuntimeError("the transport is closed")
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _head(request, body)
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        connection = self._reused(origin) or await self._connect(origin, request, timeouts.get("connect"))
        self._busy.add(connection)
        try:
            await connection.send(head, request, timeouts.get("write"))
            status, headers = await connection.response(request, timeouts.get("read"))
        except BaseException:
            self._busy.discard(connection)
            connection.close()
            raise
        return httpx.Response(
            status,
            headers=headers,
            stream=_Body(connection, self, origin, request, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    def _other(self) -> httpx.AsyncBaseTransport:
        if self._fallback is None:
            self._fallback = httpx.AsyncHTTPTransport(verify=self._context())
        return self._fallback

    def _context(self) -> ssl.SSLContext:
        if self._verify is None:
            self._verify = httpx.create_ssl_context()
        return self._verify

    def _reused(self, origin: Origin) -> _Connection | None:
        """The origin's most recently used idle connection that is still open and not too old, if any."""
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.open and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, request: httpx.Request, seconds: float | None) -> _Connection:
        scheme, host, port = origin
        secure = scheme == "https"
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(seconds):
                _, connection = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    ssl=self._context() if secure else None,
                    server_hostname=host if secure else None,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return connection

    def _release(self, origin: Origin, connection: _Connection) -> None:
        """A connection whose response was closed: kept if it was read to its end and may carry another, else closed."""
        self._busy.discard(connection)
        if connection.reusable:
            self._keep(origin, connection)
        else:
            connection.close()

    def _keep(self, origin: Origin, connection: _Connection) -> None:
        """A connection whose response was read to its end, ready for the next request to the origin."""
        if self._closed or not connection.open:
            connection.close()
            return
        now = connection.idle_since = time.monotonic()
        for kept in self._idle.values():  # every origin's (a few: the providers'), used again or not
            while kept and now - kept[0].idle_since >= KEEPALIVE_SECONDS:
                kept.popleft().close()  # the oldest: expired
        self._idle.setdefault(origin, deque()).append(connection)

    def idle(self) -> int:
        """Idle connections kept, over all origins."""
        return sum(len(idle) for idle in self._idle.values())

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        for connection in self._busy:  # a response still open: its next read fails, as httpcore's would
            connection._fail(httpx.ReadError("the transport was closed"))
        self._busy.clear()
        if self._fallback is not None:
            await self._fallback.aclose()


def _head(request: httpx.Request, body: bytes) -> bytes:
    """The request line, the headers and the body, as sent (a body httpx would stream goes as one chunk)."""
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
    lines += [b"%s: %s\r\n" % (name, value) for name, value in request.headers.raw]
    lines.append(b"\r\n")
    if request.headers.get("transfer-encoding", "").lower() == "chunked":
        lines.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n")
    else:
        lines.append(body)
    return b"".join(lines)


class _Connection(asyncio.Protocol):
    """One connection: a response at a time, parsed as it arrives; its body buffered until read."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.open = True  # neither side has closed it
        self.idle_since = 0.0
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._headers_done = False
        self._delimited = True  # the body's end is marked (a length, chunks): not the connection's close
        self._complete = False
        self._keep_alive = False  # the response ended and both sides let the connection carry another
        self._expecting = False  # a request was sent and its final response has not ended
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    # -- asyncio's side --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of asyncio's

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the server switched protocols unasked"))
        except httptools.HttpParserError as exc:
            unasked = exc.__context__  # `on_message_begin`'s
            self._fail(
                unasked
                if isinstance(unasked, httpx.RemoteProtocolError)
                else httpx.RemoteProtocolError(f"malformed response: {exc}")
            )

    def eof_received(self) -> bool | None:
        self.open = False
        if self._headers_done and not self._delimited and not self._complete:
            self._complete = True  # a body that ends with the connection
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._error is None and not self._complete:
            if exc is None and self._headers_done and not self._delimited:
                self._complete = True  # a body that ends with the connection (TLS on uvloop: no `eof_received`)
            else:
                self._error = (
                    httpx.ReadError(str(exc) or type(exc).__name__)
                    if exc is not None
                    else httpx.RemoteProtocolError("the server closed the connection before the response ended")
                )
        del self._parser  # it refers back to the connection: a cycle only the collector's full passes would free
        self._transport = None  # closed (an `abort()` of a selector transport closed already would fail)
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # -- the parser's side --

    def on_message_begin(self) -> None:
        if not self._expecting:  # after the response's end, or while idle: not the answer to anything sent
            raise httpx.RemoteProtocolError("the server sent a response no request asked for")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        if self._status < 200:  # an interim response (100, 103): its message ends; the real one follows
            return
        names = {name.lower() for name, _ in self._headers}
        chunked = any(n == b"transfer-encoding" and b"chunked" in v.lower() for n, v in self._headers)
        self._delimited = chunked or b"content-length" in names or self._status in (204, 304)
        self._headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self._headers_done:  # the end of an interim response
            self._headers.clear()
            return
        self._complete = True
        self._expecting = False
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()

    # -- the transport's side --

    async def send(self, data: bytes, request: httpx.Request, seconds: float | None) -> None:
        """Write a request whole (it waits only when the socket's buffer is full)."""
        if self._transport is None or not self.open or self._transport.is_closing():
            raise httpx.WriteError("the connection is closed", request=request)
        self._status, self._headers, self._headers_done, self._complete = 0, [], False, False
        self._delimited, self._keep_alive, self._error, self._expecting = True, False, None, True
        self._transport.write(data)
        if self._drained is not None:
            try:
                async with asyncio.timeout(seconds):
                    await asyncio.shield(self._drained)
            except TimeoutError as exc:
                raise httpx.WriteTimeout("sending the request timed out", request=request) from exc
            if not self.open and not self._headers_done:  # else the response came before the body went: it is read
                raise httpx.WriteError("the connection closed while the request was sent", request=request)

    async def response(self, request: httpx.Request, seconds: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The response's status and headers, once they arrived."""
        while not self._headers_done:
            await self._wait(request, seconds)
        return self._status, self._headers

    async def read(self, request: httpx.Request, seconds: float | None) -> bytes:
        """All of the body that arrived since the last read (waiting for some); `b""` at its end."""
        while not self._chunks:
            if self._complete:
                return b""
            await self._wait(request, seconds)
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    @property
    def reusable(self) -> bool:
        """Whether the response was read to its end and the connection may carry another."""
        return self.open and self._complete and not self._chunks and self._keep_alive

    async def _wait(self, request: httpx.Request, seconds: float | None) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, httpx.RequestError):
                error.request = request
            raise error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(seconds):
                await self._waiter
        except TimeoutError as exc:
            raise httpx.ReadTimeout("reading the response timed out", request=request) from exc
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self.close()
        self._wake()

    def close(self) -> None:
        """Drop the connection at once: `close()` would first send what the write buffer holds (to a server that may
        never read it) and, over TLS on uvloop, wait up to 30 s for the server's `close_notify`, reading on."""
        self.open = False
        if self._transport is not None:
            self._transport.abort()


class _Body(httpx.AsyncByteStream):
    """A response's body, read from its connection; closed, the connection goes back to its origin's idle ones if the
    body was read to its end (else it is closed)."""

    def __init__(
        self,
        connection: _Connection,
        transport: Transport,
        origin: Origin,
        request: httpx.Request,
        seconds: float | None,
    ) -> None:
        self._connection: _Connection | None = connection
        self._transport = transport
        self._origin = origin
        self._request = request
        self._seconds = seconds

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self._connection is not None:
            try:
                data = await self._connection.read(self._request, self._seconds)
            except BaseException:
                await self.aclose()
                raise
            if not data:
                return
            yield data

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        self._transport._release(self._origin, connection)


@asynccontextmanager
async def streamed(http: httpx.AsyncClient, method: str, url: str, **options: Any) -> AsyncIterator[httpx.Response]:
    """`http.stream(method, url, **options)`, its response let go of its body once closed.

    httpx binds a response's body to the response (`BoundAsyncStream` refers back to it), a reference cycle that holds
    the request, the connection's stream objects and their events (~30 objects a model call) until one of the
    collector's full passes, which a worker holding a few hundred thousand objects makes seldom (issue 36). Closed, the
    response needs its body no more."""
    response: httpx.Response | None = None
    try:
        async with http.stream(method, url, **options) as response:
            yield response
    finally:
        if response is not None:
            response.stream = _CLOSED


_CLOSED = httpx.ByteStream(b"")


def client() -> httpx.AsyncClient:
    """The HTTP client the provider adapters share, over a `Transport`: no limit on connections (a worker has up to
    `WORKER_CONCURRENCY` model calls open); stream stalls are timed by the engine, not by httpx."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=10.0), transport=Transport()
    )
