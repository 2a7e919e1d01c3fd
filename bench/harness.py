"""Shared parts of the benchmarks: a fresh database, the server as real processes, a light SSE client, the setup.

Every benchmark prints its setup (commit, cores, Postgres, settings) and its numbers (`design/targets.md`).
Postgres: `DATABASE_URL`'s server when set (a fresh database per run), otherwise an embedded one in a temp folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy.engine import make_url

from app import db, dsn, migrations, postgres
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "bench" / "agents"


class PrivatePostgres:
    """A Postgres server of this test's own (from the `pgserver` wheel), so the test may stop and start it."""

    def __init__(self, folder: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pgserver's platformdirs warns about XDG_RUNTIME_DIR
            from pgserver.postgres_server import get_server  # where it is defined: the package does not re-export it

        self._server = get_server(folder, cleanup_mode="stop")
        self.url: str = self._server.get_uri()
        self._socket_dir = self.url.rsplit("host=", 1)[1]

    def _pg_ctl(self, *args: str) -> None:
        # pgserver makes its command functions at import time (`setattr` on the module), which mypy cannot see
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", *args], pgdata=self._server.pgdata, user=self._server.system_user, timeout=30)

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:  # as pgserver starts it: no TCP, the socket in its folder
        self._pg_ctl("-o", '-h ""', "-o", f"-k {self._socket_dir}", "-l", str(self._server.log), "start")

    def cleanup(self) -> None:
        """Stop it for good: pgserver's own cleanup leaves a server that was restarted with `start` running."""
        with contextlib.suppress(Exception):
            self.stop()
        self._server.cleanup()


class PgBouncer:
    """Debian's PgBouncer in transaction mode in front of the Postgres server at `server_url` (any database on it,
    reached as the URL's user, trusted), listening on 127.0.0.1 at a free port; its configuration and log in
    `folder`. As root it runs as `postgres` (it refuses to run as root), or as the owner of the server's Unix socket
    folder when the URL names one (a `pgserver` one's is its own user's alone); `folder` is handed to that user."""

    def __init__(self, server_url: str, folder: Path, pool_size: int = 20) -> None:
        program = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(program).is_file():
            raise FileNotFoundError("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
        url = make_url(dsn.normalise(server_url))
        host = url.host or str(url.query.get("host", ""))  # a Unix socket's folder when the URL has no host
        self.user = url.username or "postgres"
        self.port = free_port()
        self.log = folder / "pgbouncer.log"
        (folder / "users.txt").write_text(f'"{self.user}" ""\n')
        (folder / "pgbouncer.ini").write_text(
            f"[databases]\n* = host={host} port={url.port or 5432}\n"
            f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {folder / 'users.txt'}\npool_mode = transaction\n"
            f"max_client_conn = 2000\ndefault_pool_size = {pool_size}\nlogfile = {self.log}\n"
        )
        run_as: list[str] = []
        if os.geteuid() == 0:
            owner = Path(host).owner() if host.startswith("/") else "postgres"
            for path in (folder, *folder.iterdir()):
                shutil.chown(path, user=owner)
            run_as = ["-u", owner]
        self._proc = subprocess.Popen(
            [program, *run_as, str(folder / "pgbouncer.ini")], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 10
        while not _accepts(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                said = self.log.read_text() if self.log.exists() else "(no log)"
                raise RuntimeError(f"pgbouncer did not start:\n{said}")
            time.sleep(0.05)

    def url(self, database: str) -> str:
        """The URL of `database` through the pooler."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: PgBouncer's immediate shutdown
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: list[float]) -> float:
    return statistics.median(values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """The URL of a Postgres server: `DATABASE_URL`'s, or an embedded one started for the block."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield dsn.normalise(url)
        return
    with (
        tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp,
        postgres.embedded(Settings(data_dir=Path(tmp))) as u,
    ):
        yield u


@contextlib.asynccontextmanager
async def database(server_url: str) -> AsyncIterator[str]:
    """A fresh, migrated database on `server_url`, dropped afterwards."""
    name = f"agents_bench_{uuid.uuid4().hex[:10]}"
    admin = await db.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine = db.create_engine(url, 1)
    await migrations.upgrade(engine)
    await engine.dispose()
    try:
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def postgres_version(url: str) -> str:
    conn = await db.connect(url)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


def setup(name: str, settings: dict[str, Any], pg_version: str) -> None:
    """Print what a reader needs to compare figures: commit, machine, Postgres, the benchmark's settings."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"# {name}")
    print(f"commit     {commit or '?'}{' (modified)' if dirty else ''}")
    print(f"machine    {os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}")
    print(f"postgres   {pg_version} ({'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'embedded'})")
    for key, value in settings.items():
        print(f"{key:<10} {value}")
    sys.stdout.flush()


@dataclass
class Process:
    """An `agents` command running as a real process; its output goes to a log file."""

    args: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    agents: Path = AGENTS

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app", "--agents-dir", str(self.agents), *self.args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time used so far by these processes (Linux `/proc`)."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextlib.asynccontextmanager
async def servers(
    url: str,
    commands: list[list[str]],
    extra_env: dict[str, str] | None = None,
    pids: list[int] | None = None,
    agents: Path = AGENTS,
) -> AsyncIterator[str]:
    """Start `agents <command>` processes on database `url` (the first one serves HTTP) with the agents folder
    `agents`; yield the base URL. `pids`, when given, receives the processes' ids (for `cpu_seconds`)."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": url, "PORT": str(port), **(extra_env or {})}
    logs = Path(tempfile.mkdtemp(prefix="bench-logs-"))
    procs = [Process(cmd, env, logs / f"{i}-{cmd[0]}.log", agents=agents) for i, cmd in enumerate(commands)]
    for p in procs:
        p.start()
    base = f"http://127.0.0.1:{port}"
    if pids is not None:
        pids.extend(p.proc.pid for p in procs if p.proc is not None)
    try:
        await _until_ready(base, procs)
        yield base
    finally:
        for p in procs:
            p.stop()
    shutil.rmtree(logs)  # kept when something failed, for the post-mortem


async def _until_ready(base: str, procs: list[Process], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=base) as client:
        while time.monotonic() < deadline:
            for p in procs:
                if p.proc is not None and p.proc.poll() is not None:
                    raise SystemExit(f"`agents {' '.join(p.args)}` exited early:\n{p.log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise SystemExit(f"server not ready in {timeout} s")


@dataclass
class Received:
    seq: int | None
    type: str
    data: dict[str, Any]
    at: float  # time.time() when the event's last line was read


@dataclass
class Stream:
    """One SSE connection over a bare socket (HTTP/1.0, so the body is raw lines): cheap enough for 1,000 at once."""

    base: str
    path: str
    events: list[Received] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: list[tuple[str, asyncio.Future[Received]]] = field(default_factory=list)
    closed_by_server: bool = False

    def wait_for(self, type_: str) -> asyncio.Future[Received]:
        """A future for the next event of `type_` read after this call."""
        future: asyncio.Future[Received] = asyncio.get_running_loop().create_future()
        self.waiters.append((type_, future))
        return future

    async def run(self) -> None:
        parts = urlsplit(self.base)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port, limit=1 << 20)
        try:
            writer.write(
                f"GET {self.path} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"GET {self.path}: {status!r}")
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            self.connected.set()
            await self._read(reader)
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        seq: int | None = None
        type_ = "message"
        data: list[str] = []
        while True:
            raw = await reader.readline()
            if not raw:
                self.closed_by_server = True
                return
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if data:
                    self._dispatch(Received(seq, type_, json.loads("\n".join(data)), time.time()))
                seq, type_, data = None, "message", []
            elif line.startswith(":"):
                continue
            else:
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "id":
                    seq = int(value)
                elif key == "event":
                    type_ = value
                elif key == "data":
                    data.append(value)

    async def until(
        self, type_: str, test: Callable[[Received], bool], start: int = 0, timeout: float = 60
    ) -> Received:
        """The first event of `type_` passing `test` among those read from index `start` on: already read, or the
        next ones. (Waiting with `wait_for` alone misses an event read in the same chunk as the one before it.)"""
        async with asyncio.timeout(timeout):
            while True:
                future = self.wait_for(type_)  # registered before looking: nothing read after the look is missed
                for event in self.events[start:]:
                    if event.type == type_ and test(event):
                        return event
                start = len(self.events)
                await future

    def _dispatch(self, event: Received) -> None:
        self.events.append(event)
        waiting = []
        for type_, future in self.waiters:
            if type_ == event.type and not future.done():
                future.set_result(event)
            elif not future.done():
                waiting.append((type_, future))
        self.waiters = waiting
