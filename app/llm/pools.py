"""The HTTP client the provider adapters share, its connections in several pools.

httpcore looks over every connection of a pool each time a request starts or a response ends (and, for each idle
one, over all of them again): with a few hundred model streams open in one pool, that walk cost more CPU than the
streams themselves (a fifth of a B4 server's samples at 100 clients). Here a request goes to the first pool with
room (fewer than `per_pool` responses open), so a quiet process keeps one pool and reuses its connections, and a
busy one spreads over pools of `per_pool` each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx


class Pools(httpx.AsyncBaseTransport):
    """`count` connection pools (httpx's own transport each, made with `options`); a request to the first with fewer
    than `per_pool` responses open, else to the least busy."""

    def __init__(self, count: int = 16, per_pool: int = 32, **options: Any) -> None:
        self._pools = [httpx.AsyncHTTPTransport(**options) for _ in range(count)]
        self._open = [0] * count  # responses open per pool: sent and not yet closed
        self._per_pool = per_pool

    def _pick(self) -> int:
        for i, count in enumerate(self._open):
            if count < self._per_pool:
                return i
        return min(range(len(self._open)), key=self._open.__getitem__)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        i = self._pick()
        self._open[i] += 1
        try:
            response = await self._pools[i].handle_async_request(request)
        except BaseException:
            self._open[i] -= 1
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)  # an async transport's
        response.stream = _Counted(response.stream, self._open, i)
        return response

    def open(self) -> list[int]:
        """Responses open in each pool."""
        return list(self._open)

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()


class _Counted(httpx.AsyncByteStream):
    """A response's body that counts its pool's open responses down once, when closed."""

    def __init__(self, stream: httpx.AsyncByteStream, counts: list[int], i: int) -> None:
        self._stream = stream
        self._counts: list[int] | None = counts
        self._i = i

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            counts, self._counts = self._counts, None
            if counts is not None:
                counts[self._i] -= 1


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
    """The HTTP client the provider adapters share: no limit on connections (a worker has up to `WORKER_CONCURRENCY`
    model calls open; httpx's 100 would queue the rest into its pool timeout), spread over `Pools`; stream stalls are
    timed by the engine, not by httpx."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=10.0, read=None, write=30.0, pool=10.0), transport=Pools(limits=limits)
    )
