"""Helpers for tests that run `python -m app …` as real subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m app <args>` from the repo root, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def until_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Poll `/ready` until the server answers 200."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(base_url=base) as client:
        while asyncio.get_running_loop().time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{log.read_text()}")
            try:
                if (await client.get("/ready")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"server not ready in time:\n{log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then the exit code (a process that ignores it is killed and the test fails)."""
    proc.terminate()
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@contextlib.contextmanager
def page_server(page: Callable[[], bytes], assets: Mapping[str, tuple[str, bytes]] | None = None) -> Iterator[int]:
    """A second web server (another origin than the API's), on a port of its own, serving the HTML `page()` makes at
    `/` and each of `assets` (path: media type, body) to any host name (404 elsewhere), without logging; yields its
    port."""
    served = {"/": ("text/html; charset=utf-8", b""), **(assets or {})}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            media, body = served.get(self.path, ("text/html; charset=utf-8", b""))
            body = page() if self.path == "/" else body
            self.send_response(200 if self.path in served else 404)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the test's output is the browser's, not this server's request lines."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.asynccontextmanager
async def api(database_url: str, folder: Path, name: str, extra: dict[str, str] | None = None) -> AsyncIterator[int]:
    """`agents api` on a free port of this machine, ready, with `extra` settings (no `SECRET_KEY`, `AGENTS_DIR` or
    `KEEP_ALIVE_SECONDS` from this process's environment); yields its port. Its output is `folder/<name>.log`; it
    must exit cleanly on SIGTERM."""
    port = free_port()
    log = folder / f"{name}.log"
    unset = ("SECRET_KEY", "AGENTS_DIR", "KEEP_ALIVE_SECONDS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env |= {"DATABASE_URL": database_url, "PORT": str(port), "DATA_DIR": str(folder), **(extra or {})}
    proc = start(["api"], env, log)
    try:
        await until_ready(f"http://127.0.0.1:{port}", proc, log)
        yield port
    finally:
        assert stop(proc) == 0
