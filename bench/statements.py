"""Statements and transactions per tool run, counted by Postgres itself (`pg_stat_statements`, `pg_stat_database`).

A Postgres server of the script's own (Debian's binaries, `initdb` in a temp folder, `pg_stat_statements` preloaded),
one `agents serve` process with `bench/agents`, and turns of the `steps` agent told `steps 1`: the user's message, one
LLM step that calls the `noop` tool, its result, and a second LLM step that answers — a "tool run", as the peer
benchmark's `tool` graph. Each client keeps a thread and its stream open, as a chat client would, and posts its
turns one after another, awaited on the stream; `--clients` at a time. The counters are reset after a warm-up;
then every statement the server sent is listed with its calls per run. Unlike wall time, these counts do not move
with the machine's load: run it before and after a change.

    .venv/bin/python -m bench.statements [--runs 200] [--clients 1] [--top 30] [--trace]

`--trace` then runs one more turn with `log_statement = all` and lists what it sent, in order, by backend.

Target (issue 34): a step in at most two transactions, a tool run in at most three (the worker's), ≤ 12 statements.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx

from bench.harness import Stream, database, free_port, servers, setup

BIN = Path("/usr/lib/postgresql")


def _binaries() -> Path:
    found = sorted(BIN.glob("*/bin/initdb"))
    if not found:
        raise SystemExit("needs Debian's Postgres server binaries (/usr/lib/postgresql/*/bin)")
    return found[-1].parent


@contextlib.contextmanager
def counting_postgres() -> Iterator[str]:
    """A throw-away Postgres server with `pg_stat_statements` loaded; its URL (TCP on a free loopback port). Its log
    is the file `log` beside its data folder (`trace`)."""
    binaries = _binaries()
    folder = Path(tempfile.mkdtemp(prefix="bench-stmts-"))
    run_as: list[str] = []
    if os.geteuid() == 0:  # Postgres refuses to run as root
        shutil.chown(folder, user="postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()
    subprocess.run([*run_as, str(binaries / "initdb"), "-A", "trust", "-U", "postgres", "-D", str(data)],
                   check=True, capture_output=True)  # fmt: skip
    options = (
        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c shared_preload_libraries=pg_stat_statements "
        "-c pg_stat_statements.track=all -c fsync=off -c synchronous_commit=off -c max_connections=200"
    )
    ctl = [*run_as, str(binaries / "pg_ctl"), "-D", str(data), "-w", "-l", str(folder / "log")]
    subprocess.run([*ctl, "-o", options, "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*ctl, "-m", "immediate", "stop"], check=False, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


class User:
    """A chat client: one thread of the `steps` agent and its open stream; each run is one turn on it."""

    def __init__(self, client: httpx.AsyncClient, base: str, steps: int, agent: str = "steps") -> None:
        self.client, self.base, self.steps, self.agent = client, base, steps, agent
        self.thread = ""
        self.stream: Stream | None = None
        self.reading: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self.thread = (await self.client.post("/threads", json={"agent": self.agent})).raise_for_status().json()["id"]
        self.stream = Stream(self.base, f"/threads/{self.thread}/events")
        self.reading = asyncio.create_task(self.stream.run())
        await asyncio.wait_for(self.stream.connected.wait(), 30)

    async def tool_run(self) -> None:
        """One turn with one tool call, awaited on the thread's stream: until the thread is idle again (after its
        `turn_ended`; or after `session_ended` alone, when the turn finds the session's steps all spent: every 125
        runs of `steps 1` at the server's default of 250 steps a session)."""
        assert self.stream is not None
        start = len(self.stream.events)
        posted = await self.client.post(f"/threads/{self.thread}/messages", json={"content": f"steps {self.steps}"})
        posted.raise_for_status()
        await self.stream.until("thread_status", lambda e: e.data.get("status") == "idle", start)

    async def close(self) -> None:
        if self.reading is not None:
            self.reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reading


async def runs(users: list[User], count: int) -> None:
    queue = iter(range(count))

    async def turns(user: User) -> None:
        for _ in queue:
            await user.tool_run()

    await asyncio.gather(*(turns(u) for u in users))


# what the count leaves out: the counting itself
COUNTING = ("pg_stat_statements", "pg_stat_database", "pg_stat_reset")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--trace", action="store_true", help="then list one more run's statements in order, by backend")
    parser.add_argument("--steps", type=int, default=1, help="tool calls per turn (1: a tool run)")
    parser.add_argument(
        "--b4",
        action="store_true",
        help="B4's shape: three 0.5 s tool calls at once in one answer, then a reply streamed in 10 chunks over 1 s",
    )
    args = parser.parse_args()
    if args.b4:
        os.environ.update(BENCH_CALLS="3", BENCH_TOOL_S="0.5", BENCH_CHUNK_MS="110")
    with counting_postgres() as server:
        admin = await asyncpg.connect(server)
        version = str(await admin.fetchval("SHOW server_version"))
        shape = {"runs": args.runs, "clients": args.clients, "steps": args.steps, "b4": args.b4}
        setup("statements per tool run", shape, version)
        async with database(server) as url:
            name = url.rsplit("/", 1)[1]
            oid = await admin.fetchval("SELECT oid FROM pg_database WHERE datname = $1", name)
            await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            async with servers(url, [["serve"]]) as base, httpx.AsyncClient(base_url=base, timeout=60) as client:
                agent = "fanout_parallel" if args.b4 else "steps"
                users = [User(client, base, args.steps, agent) for _ in range(args.clients)]
                await asyncio.gather(*(u.open() for u in users))
                await runs(users, args.warmup)
                await asyncio.sleep(0.5)
                await admin.execute("SELECT pg_stat_statements_reset()")
                await admin.execute("SELECT pg_stat_reset()")
                before = await admin.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datid = $1", oid)
                await runs(users, args.runs)
                await asyncio.sleep(0.5)  # the last release's statements
                commits = await admin.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datid = $1", oid)
                rows = await admin.fetch(
                    "SELECT query, calls FROM pg_stat_statements WHERE dbid = $1 AND toplevel ORDER BY calls DESC", oid
                )
                if args.trace:
                    traced = await trace(admin, users[0])
                await asyncio.gather(*(u.close() for u in users))
        await admin.close()
    counted = [(r["query"], r["calls"]) for r in rows if not any(s in r["query"] for s in COUNTING)]
    total = sum(calls for _, calls in counted)
    explicit = sum(calls for query, calls in counted if query.strip().upper() == "BEGIN" or query.startswith("BEGIN "))
    committed = ((commits or 0) - (before or 0)) / args.runs
    print(f"\nstatements per tool run   {total / args.runs:.1f}  (those the server sent, not those run inside them)")
    print(f"explicit transactions     {explicit / args.runs:.1f}  (BEGIN … COMMIT)")
    print(f"commits per tool run      {committed:.1f}  (every transaction, any connection)")
    print(f"\n{'calls/run':>9}  statement")
    for query, calls in counted[: args.top]:
        print(f"{calls / args.runs:9.2f}  {' '.join(query.split())[:150]}")
    if args.trace:
        print("\none more run, statement by statement (backend pid, then the statement):")
        for line in traced:
            print(line)


async def trace(admin: asyncpg.Connection, user: User) -> list[str]:
    """One more tool run with every statement logged; the statements it sent, in order, each with its backend."""
    log_file = Path(await admin.fetchval("SHOW data_directory")).parent / "log"  # as `counting_postgres` starts it
    start = log_file.stat().st_size
    await admin.execute("ALTER SYSTEM SET log_statement = 'all'")
    await admin.execute("SELECT pg_reload_conf()")
    await asyncio.sleep(0.2)
    await user.tool_run()
    await asyncio.sleep(0.5)
    await admin.execute("ALTER SYSTEM RESET log_statement")
    await admin.execute("SELECT pg_reload_conf()")
    with log_file.open(errors="replace") as f:
        f.seek(start)
        text = f.read()
    lines = []
    for match in re.finditer(r"\[(\d+)\] LOG:  (?:statement|execute [^:]*): (.*?)(?=\n\S|\Z)", text, re.S):
        statement = " ".join(match.group(2).split())
        if not any(s in statement for s in (*COUNTING, "log_statement", "pg_reload_conf")):
            lines.append(f"{match.group(1):>7}  {statement[:160]}")
    return lines


if __name__ == "__main__":
    asyncio.run(main())
