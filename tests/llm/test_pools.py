"""The provider adapters' HTTP client (`app/llm/pools.py`): one pool while quiet, several when many responses are open,
every response counted out when it closes. Against a real HTTP/1.1 server on a loopback port."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator

import httpx
import pytest

from app.llm.pools import Pools, streamed


class Server:
    """Keep-alive HTTP/1.1: each answer's headers at once, its body (`ok`) once `release` is set."""

    def __init__(self) -> None:
        self.connections = 0
        self.release = asyncio.Event()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
                await writer.drain()
                await self.release.wait()
                writer.write(b"ok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    found = Server()
    listening = await asyncio.start_server(found.handle, "127.0.0.1", 0)
    found.port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield found


async def test_calls_one_after_another_reuse_one_connection_of_the_first_pool(server: Server) -> None:
    server.release.set()
    pools = Pools(count=4, per_pool=2)
    async with httpx.AsyncClient(transport=pools) as client:
        for _ in range(3):
            assert (await client.get(f"http://127.0.0.1:{server.port}/")).text == "ok"
        assert pools.open() == [0, 0, 0, 0]
    assert server.connections == 1


async def test_responses_open_at_once_spread_over_pools_and_are_counted_out(server: Server) -> None:
    pools = Pools(count=3, per_pool=2)
    async with httpx.AsyncClient(transport=pools) as client:
        url = f"http://127.0.0.1:{server.port}/"
        streams = [client.stream("GET", url) for _ in range(7)]
        responses = [await s.__aenter__() for s in streams]  # headers in, bodies not: all seven open
        assert pools.open() == [3, 2, 2]  # two per pool, then the least busy (the first of equals)
        server.release.set()
        for stream, response in zip(streams, responses, strict=True):
            assert await response.aread() == b"ok"
            await stream.__aexit__(None, None, None)
        assert pools.open() == [0, 0, 0]
        assert (await client.get(url)).text == "ok"  # quiet again: the first pool, a connection kept
        assert pools.open() == [0, 0, 0]
    assert server.connections == 7


async def test_a_request_that_fails_is_not_counted_open() -> None:
    pools = Pools(count=2, per_pool=1)
    async with httpx.AsyncClient(transport=pools) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:9/")  # nothing listens on the discard port
        assert pools.open() == [0, 0]


async def test_a_streamed_response_is_freed_without_the_cycle_collector(server: Server) -> None:
    """Once closed, a response lets go of its body: httpx's body refers back to its response, a cycle that held the
    request and the connection's stream objects of every model call until one of the collector's full passes."""
    server.release.set()
    async with httpx.AsyncClient(transport=Pools(count=1)) as client:
        gc.disable()
        try:
            async with streamed(client, "GET", f"http://127.0.0.1:{server.port}/") as response:
                assert await response.aread() == b"ok"
            assert response.is_closed
            freed = weakref.ref(response)
            del response
            assert freed() is None
        finally:
            gc.enable()
