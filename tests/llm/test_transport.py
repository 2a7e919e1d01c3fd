"""The provider adapters' HTTP transport (`app/llm/transport.py`) against real HTTP/1.1 servers on loopback ports:
connections kept and reused, bodies of every framing read as they arrive, and each way a connection can fail raised
as httpx raises it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import ipaddress
import os
import socket
import ssl
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from app.llm import transport
from app.llm.transport import Transport, streamed

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server running `handler` on each connection; counts connections and keeps each request's head."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):  # the client went away
                await self.handler(reader, writer)
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request's head and its body (by `Content-Length`, or chunked); the head."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        lines = head.decode().lower().split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.startswith("content-length:")), 0)
        if "transfer-encoding: chunked" in lines:
            body = b""
            while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
                body += (await reader.readexactly(size + 2))[:-2]
            await reader.readexactly(2)
            self.bodies.append(body)
        else:
            self.bodies.append(await reader.readexactly(length))
        return head


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    started: list[asyncio.Server] = []

    async def start(handler: Handler, context: ssl.SSLContext | None = None) -> Server:
        server = Server(handler)
        listening = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=context)
        started.append(listening)
        scheme = "https" if context else "http"
        server.url = f"{scheme}://{'localhost' if context else '127.0.0.1'}:{listening.sockets[0].getsockname()[1]}"
        return server

    yield start
    for listening in started:
        listening.close()


def keep_alive(body: bytes = b"ok", *, head: bytes = b"") -> Callable[[Server], Handler]:
    """Answer every request on the connection with `body` (by `Content-Length`)."""

    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
                await writer.drain()

        return run

    return handler


def held_back(first: bytes, rest: bytes, release: asyncio.Event) -> Callable[[Server], Handler]:
    """Answer every request on the connection with `first` at once, then `rest` once `release` is set."""

    def handler(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.request(reader)
                writer.write(first)
                await writer.drain()
                await release.wait()
                writer.write(rest)
                await writer.drain()

        return run

    return handler


async def started(serve: Callable[..., Awaitable[Server]], make: Callable[[Server], Handler]) -> Server:
    holder: list[Server] = []

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await make(holder[0])(reader, writer)

    server = await serve(run)
    holder.append(server)
    return server


async def test_requests_one_after_another_reuse_one_connection(serve: Callable[..., Awaitable[Server]]) -> None:
    server = await started(serve, keep_alive())
    async with httpx.AsyncClient(transport=Transport()) as client:
        for n in range(3):
            response = await client.post(f"{server.url}/v1/chat?n={n}", json={"n": n})
            assert (response.status_code, response.text) == (200, "ok")
    assert server.connections == 1
    assert server.heads[2].startswith(b"POST /v1/chat?n=2 HTTP/1.1\r\n") and b"Host: 127.0.0.1:" in server.heads[2]
    assert server.bodies == [b'{"n":0}', b'{"n":1}', b'{"n":2}']


async def test_responses_open_at_once_each_have_a_connection_then_are_kept(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    release = asyncio.Event()
    server = await started(serve, held_back(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", b"ok", release))
    kept = Transport()
    async with httpx.AsyncClient(transport=kept) as client:
        streams = [client.stream("GET", server.url) for _ in range(5)]
        responses = [await s.__aenter__() for s in streams]  # headers in, bodies not: all five open
        assert server.connections == 5 and kept.idle() == 0
        release.set()
        for stream, response in zip(streams, responses, strict=True):
            assert await response.aread() == b"ok"
            await stream.__aexit__(None, None, None)
        assert kept.idle() == 5
        assert (await client.get(server.url)).text == "ok"
    assert server.connections == 5


async def test_a_streamed_body_is_handed_on_as_it_arrives_and_reads_merge_what_waited(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    """A chunked body (an SSE stream): the first chunk is read before the server sends the next; chunks that arrived
    while nobody read come out as one read."""
    go_on = asyncio.Event()

    def chunked(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n")
            writer.write(b"7\r\ndata: 1\r\n")
            await writer.drain()
            await go_on.wait()
            writer.write(b"7\r\ndata: 2\r\n7\r\ndata: 3\r\n0\r\n\r\n")
            await writer.drain()
            await reader.read()

        return run

    server = await started(serve, chunked)
    async with httpx.AsyncClient(transport=Transport()) as client, client.stream("GET", server.url) as response:
        reads = response.aiter_bytes()
        assert await anext(reads) == b"data: 1"
        go_on.set()
        await asyncio.sleep(0.05)  # both chunks arrive before the next read
        assert [r async for r in reads] == [b"data: 2data: 3"]


async def test_a_body_that_ends_with_the_connection_is_read_to_its_end(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    def closing(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
            await writer.drain()

        return run

    server = await started(serve, closing)
    kept = Transport()
    async with httpx.AsyncClient(transport=kept) as client:
        assert (await client.get(server.url)).text == "all of it"
        assert kept.idle() == 0  # the server closed it: not kept
        assert (await client.get(server.url)).text == "all of it"
    assert server.connections == 2


async def test_a_response_closed_before_its_end_or_marked_close_gives_no_connection_back(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    rest = asyncio.Event()
    server = await started(serve, held_back(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab", b"cd", rest))
    kept = Transport()
    async with httpx.AsyncClient(transport=kept) as client:
        async with client.stream("GET", server.url) as response:
            assert await anext(response.aiter_raw()) == b"ab"  # half of the body, then closed
        assert kept.idle() == 0
        rest.set()
        assert (await client.get(server.url)).text == "abcd"
        assert kept.idle() == 1
    assert server.connections == 2
    marked = await started(serve, keep_alive(head=b"Connection: close\r\n"))
    kept = Transport()
    async with httpx.AsyncClient(transport=kept) as client:
        assert (await client.get(marked.url)).text == "ok"
        assert kept.idle() == 0


async def test_a_connection_the_server_closed_while_idle_is_not_used_again(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    def once(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()  # then closes: a server's idle timeout

        return run

    server = await started(serve, once)
    async with httpx.AsyncClient(transport=Transport()) as client:
        assert (await client.get(server.url)).text == "ok"
        await asyncio.sleep(0.05)  # the close arrives
        assert (await client.get(server.url)).text == "ok"
    assert server.connections == 2


async def test_an_idle_connection_older_than_the_keep_alive_is_not_used_again(
    serve: Callable[..., Awaitable[Server]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "KEEPALIVE_SECONDS", 0.05)
    server, other = await started(serve, keep_alive()), await started(serve, keep_alive())
    kept = Transport()
    async with httpx.AsyncClient(transport=kept) as client:
        assert (await client.get(server.url)).text == "ok"
        await asyncio.sleep(0.1)
        assert (await client.get(other.url)).text == "ok"  # another origin's release closes the expired one too
        assert kept.idle() == 1
        assert (await client.get(server.url)).text == "ok"
    assert server.connections == 2


async def test_interim_responses_are_skipped_and_a_chunked_request_body_is_sent_chunked(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    def interim(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await server.request(reader)
                writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone")
                await writer.drain()

        return run

    async def parts() -> AsyncIterator[bytes]:
        yield b"one "
        yield b"two"

    server = await started(serve, interim)
    async with httpx.AsyncClient(transport=Transport()) as client:
        response = await client.post(server.url, content=parts())
        assert (response.status_code, response.text, response.headers.get("link")) == (201, "done", None)
        assert (await client.post(server.url, content=b"")).text == "done"
    assert server.bodies == [b"one two", b""] and server.connections == 1


async def test_failures_are_httpx_errors(serve: Callable[..., Awaitable[Server]]) -> None:
    """Nothing listening: `ConnectError`; a response that stops half-way: `RemoteProtocolError`; one that is not
    HTTP: `RemoteProtocolError`; one that does not come in time: `ReadTimeout`."""

    def half(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
            await writer.drain()

        return run

    def garbage(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            writer.write(b"SMTP ready\r\n\r\n")
            await writer.drain()
            await reader.read()

        return run

    def silent(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            await reader.read()

        return run

    async with httpx.AsyncClient(transport=Transport()) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:9/")  # the discard port: nothing listens
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get((await started(serve, half)).url)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get((await started(serve, garbage)).url)
        with pytest.raises(httpx.ReadTimeout):
            await client.get((await started(serve, silent)).url, timeout=httpx.Timeout(5.0, read=0.1))


def _certificate(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for `localhost`: the server's context, and a client's that trusts it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return server, ssl.create_default_context(cafile=str(folder / "cert.pem"))


async def test_https_is_verified_and_its_connections_are_kept_too(
    serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    server_context, trusting = _certificate(tmp_path)
    holder: list[Server] = []

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await keep_alive(b"secret")(holder[0])(reader, writer)

    server = await serve(run, server_context)
    holder.append(server)
    async with httpx.AsyncClient(transport=Transport(verify=trusting)) as client:
        assert (await client.get(server.url)).text == "secret"
        assert (await client.get(server.url)).text == "secret"
    assert server.connections == 1
    async with httpx.AsyncClient(transport=Transport(verify=ssl.create_default_context())) as client:
        with pytest.raises(httpx.ConnectError):  # not a certificate the default trust knows
            await client.get(server.url)


async def test_a_streamed_response_is_freed_without_the_cycle_collector(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    """Once closed, a response lets go of its body: httpx's body refers back to its response, a cycle that held the
    request and the connection's objects of every model call until one of the collector's full passes."""
    server = await started(serve, keep_alive())
    async with httpx.AsyncClient(transport=Transport()) as client:
        gc.disable()
        try:
            async with streamed(client, "GET", server.url) as response:
                assert await response.aread() == b"ok"
            assert response.is_closed
            freed = weakref.ref(response)
            del response
            assert freed() is None
        finally:
            gc.enable()


def test_it_runs_on_uvloop_as_the_server_does() -> None:
    """The server's event loop is uvloop's (uvicorn picks it), whose transports are not asyncio's classes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
            await writer.drain()

    async def main() -> list[str]:
        listening = await asyncio.start_server(answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/"
        async with listening, httpx.AsyncClient(transport=Transport()) as client:
            return [(await client.get(url)).text for _ in range(2)]

    assert uvloop.run(main()) == ["ok", "ok"]


async def test_bytes_the_server_sends_after_a_response_or_while_idle_are_no_response(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    """A response nothing asked for (a server's duplicate, a `408` on its idle timeout) is not read as the body of
    the response before it, nor as the answer to the next request: the connection is dropped (httpcore reads the
    response to its end only, and does not reuse a connection with bytes waiting)."""

    def stray(at_once: bool) -> Callable[[Server], Handler]:
        def handler(server: Server) -> Handler:
            async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await server.request(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                if not at_once:
                    await writer.drain()
                    await asyncio.sleep(0.02)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")
                while True:
                    await server.request(reader)
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
                    await writer.drain()

            return run

        return handler

    for at_once in (True, False):
        server = await started(serve, stray(at_once))
        async with httpx.AsyncClient(transport=Transport()) as client:
            assert (await client.get(server.url)).text == "ok"
            await asyncio.sleep(0.05)  # the stray response arrives
            assert (await client.get(server.url)).text == "ok"  # a new connection's first answer
        assert server.connections == 2


def _tls_server(context: ssl.SSLContext, answer: Callable[[ssl.SSLSocket], None]) -> tuple[str, threading.Thread]:
    """A blocking TLS server in a thread, for one connection: `answer` gets it once the request's head is in. Its
    `close()` sends no `close_notify` (as many servers do not); it reads nothing while it answers."""
    listening = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with listening, listening.accept()[0] as raw, context.wrap_socket(raw, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(65536)
            answer(tls)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return f"https://localhost:{listening.getsockname()[1]}/", thread


def test_on_uvloop_a_tls_body_that_ends_with_the_connection_is_read_to_its_end(tmp_path: Path) -> None:
    """No length, not chunked: the body ends with the connection. uvloop's TLS calls no `eof_received` for a TCP close
    without TLS's `close_notify`, only `connection_lost`; httpcore reads such a body to its end."""
    server_context, trusting = _certificate(tmp_path)
    url, thread = _tls_server(server_context, lambda tls: tls.sendall(b"HTTP/1.1 200 OK\r\n\r\nall of it"))

    async def main() -> str:
        async with httpx.AsyncClient(transport=Transport(verify=trusting)) as client:
            return (await client.get(url)).text

    assert uvloop.run(main()) == "all of it"
    thread.join(5)


def test_on_uvloop_a_tls_response_closed_before_its_end_drops_its_connection_at_once(tmp_path: Path) -> None:
    """A stream left before its end (cancelled, or not read after its last event): the server must see the
    connection go, not stream on into it (a model generating for nobody). A transport's `close()` over uvloop's TLS
    sends `close_notify` and reads on, up to 30 s, until the server answers with its own; httpcore closes the socket."""
    server_context, trusting = _certificate(tmp_path)
    gone, stop = threading.Event(), threading.Event()

    def stream(tls: ssl.SSLSocket) -> None:
        tls.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while not stop.is_set():
                tls.sendall(b"7\r\ndata: x\r\n")
                time.sleep(0.01)
        except OSError:
            gone.set()

    url, thread = _tls_server(server_context, stream)

    async def main() -> bool:
        async with httpx.AsyncClient(transport=Transport(verify=trusting)) as client:
            async with client.stream("GET", url) as response:
                await anext(response.aiter_bytes())
            seen = await asyncio.to_thread(gone.wait, 2.0)
            stop.set()  # else the server's close ends it
            await asyncio.sleep(0.1)
            return seen

    assert uvloop.run(main())
    thread.join(5)


async def test_a_response_the_server_sends_before_reading_the_whole_body_is_the_answer(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    """A request too large for the server: it answers `413` at once, ends its side and reads the rest of the body
    away (nginx's lingering close). The answer is the `413` (as httpcore returns it), not a `WriteError` (which the
    adapters would retry as a connection failure)."""

    def refusing(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo long")
            writer.write_eof()
            while await reader.read(1 << 20):  # the rest of the body, read and dropped
                continue

        return run

    server = await started(serve, refusing)
    async with httpx.AsyncClient(transport=Transport()) as client:
        response = await client.post(server.url, content=b"x" * (32 << 20))
    assert (response.status_code, response.text) == (413, "too long")


async def test_a_request_that_timed_out_while_sent_leaves_no_socket_open(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    """A server that reads no body: `WriteTimeout`, and the connection is gone, not left open with the rest of the
    request waiting to be sent for as long as the server lives."""
    stop = asyncio.Event()
    clients: list[tuple[str, int]] = []

    def stalled(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            clients.append(writer.get_extra_info("peername"))
            await reader.readuntil(b"\r\n\r\n")
            await stop.wait()

        return run

    server = await started(serve, stalled)
    try:
        async with httpx.AsyncClient(transport=Transport()) as client:
            with pytest.raises(httpx.WriteTimeout):
                await client.post(server.url, content=b"x" * (32 << 20), timeout=httpx.Timeout(5.0, write=0.2))
            await asyncio.sleep(0.05)
            assert clients and not _sockets_at(clients[0])
    finally:
        stop.set()


def _sockets_at(address: tuple[str, int]) -> int:
    """How many of this process's open files are sockets bound to `address`."""
    found = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            duplicate = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue  # not a socket, or closed since listed
        with duplicate:
            found += duplicate.getsockname() == address
    return found


async def test_closing_the_transport_ends_the_responses_still_open(serve: Callable[..., Awaitable[Server]]) -> None:
    """httpcore's pool closes its connections, open responses' too: their next read fails. Not waiting on: the
    adapters' client has no read timeout."""
    ended = asyncio.Event()

    def streaming(server: Server) -> Handler:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\ndata: 1\r\n")
            await writer.drain()
            await reader.read()
            ended.set()

        return run

    server = await started(serve, streaming)
    client = httpx.AsyncClient(transport=Transport(), timeout=httpx.Timeout(5.0, read=None))
    async with client.stream("GET", server.url) as response:
        reads = response.aiter_bytes()
        assert await anext(reads) == b"data: 1"
        await client.aclose()
        with pytest.raises(httpx.TransportError):
            async with asyncio.timeout(1):
                await anext(reads)
    async with asyncio.timeout(1):
        await ended.wait()


async def test_a_closed_connection_is_freed_without_the_cycle_collector(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    """A connection not kept (the server's `Connection: close`, a stream left before its end, one idle too long) is
    freed once closed: its parser refers back to it, a cycle that would hold it, its transport and (over TLS) its
    buffers until one of the collector's full passes."""
    server = await started(serve, keep_alive(head=b"Connection: close\r\n"))
    async with httpx.AsyncClient(transport=Transport()) as client:
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                async with streamed(client, "GET", server.url) as response:
                    assert await response.aread() == b"ok"
            await asyncio.sleep(0.05)  # the connections' ends
            assert not [o for o in gc.get_objects() if isinstance(o, transport._Connection)]
        finally:
            gc.enable()
