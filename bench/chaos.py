"""The chaos harness (target R10): real processes, seeded faults, and invariants checked over what is stored.

`agents api` and several `agents worker` processes run on a Postgres of the harness's own (so it can restart it) and
drive threads of `bench/chaos_agents` — model delays, tool calls (several of one answer at once), `dual_ai` turns,
blocking subagents (two of one answer at once), a CPU-bound tool — while, at seeded random moments, workers are
killed (`kill -9`) and stopped (SIGTERM) and started again, new messages arrive mid-turn and between turns, threads
are stopped, continued and terminated, the database is restarted once and SSE clients drop their connection and
resume with `Last-Event-ID`. Then everything is left to
settle and the invariants are checked; each line prints its count and the run exits 1 on any violation.

    python -m bench.chaos --seed 1 --threads 1000 --duration 600 --workers 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from app import db, dsn, migrations
from bench.harness import ROOT, PgBouncer, PrivatePostgres, Process, free_port, setup

AGENTS = ROOT / "bench" / "chaos_agents"
LEASE_SECONDS = 3.0
POOLER_SIZE = 40  # `--pooler`: PgBouncer's server connections for the ~200 clients of the API and the workers


@dataclass
class Faults:
    """What was done to the system, for the report and to explain re-executions."""

    killed: Counter[str] = field(default_factory=Counter)  # kind → count
    victims: set[int] = field(default_factory=set)  # pids that were killed or stopped
    db_down: list[tuple[float, float]] = field(default_factory=list)  # wall-clock intervals


@dataclass
class Run:
    """A chaos run in progress: processes, threads, what was posted, what the SSE followers saw."""

    rng: random.Random
    base: str
    env: dict[str, str]
    logs: Path
    pg: PrivatePostgres
    workers: list[Process] = field(default_factory=list)
    threads: dict[str, str] = field(default_factory=dict)  # id → agent
    posted: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # thread → message ids
    terminated: set[str] = field(default_factory=set)
    followed: dict[str, list[int]] = field(default_factory=dict)  # thread → seqs an SSE follower saw
    faults: Faults = field(default_factory=Faults)
    actions: Counter[str] = field(default_factory=Counter)
    spawned: int = 0

    def worker(self) -> Process:
        self.spawned += 1
        proc = Process(["worker"], self.env, self.logs / f"worker-{self.spawned}.log", agents=AGENTS)
        proc.start()
        self.workers.append(proc)
        return proc


async def request(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A client that retries what the server could not do right now (503 while the database restarts)."""
    for _ in range(120):
        try:
            response = await client.request(method, path, **kwargs)
        except httpx.TransportError:
            await asyncio.sleep(0.25)
            continue
        if response.status_code != 503:
            return response
        await asyncio.sleep(0.25)
    raise RuntimeError(f"{method} {path}: the server kept answering 503")


async def post_message(run: Run, client: httpx.AsyncClient, tid: str, content: str) -> None:
    response = await request(client, "POST", f"/threads/{tid}/messages", json={"content": content})
    if response.status_code == 202:
        run.posted[tid].append(response.json()["message_id"])
        run.actions["message"] += 1
    elif response.status_code == 409 and tid in run.terminated:
        run.actions["message refused (terminated)"] += 1
    else:
        raise RuntimeError(f"posting to {tid}: {response.status_code} {response.text}")


async def follow(run: Run, tid: str, stop: asyncio.Event) -> None:
    """An SSE client that drops its connection at random moments and resumes with `Last-Event-ID`."""
    seen = run.followed.setdefault(tid, [])
    async with httpx.AsyncClient(base_url=run.base, timeout=httpx.Timeout(5, read=None)) as client:
        while not stop.is_set():
            headers = {"Last-Event-ID": str(seen[-1])} if seen else {}
            deadline = time.monotonic() + run.rng.uniform(0.5, 5)
            try:
                async with client.stream("GET", f"/threads/{tid}/events", headers=headers) as response:
                    if response.status_code == 200:
                        async for line in response.aiter_lines():
                            if line.startswith("id:") and line[3:].strip():
                                seen.append(int(line[3:].strip()))
                            if time.monotonic() > deadline or stop.is_set():
                                run.actions["sse drop"] += 1
                                break  # drop the connection mid-stream
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        await catch_up(client, tid, seen)


async def catch_up(client: httpx.AsyncClient, tid: str, seen: list[int]) -> None:
    """The follower's last resume, after everything settled: read until the stream has been quiet for a second."""
    headers = {"Last-Event-ID": str(seen[-1])} if seen else {}
    async with client.stream("GET", f"/threads/{tid}/events", headers=headers) as response:
        lines = response.aiter_lines()
        while True:
            try:
                async with asyncio.timeout(1):
                    line = await anext(lines)
            except (TimeoutError, StopAsyncIteration):
                return
            if line.startswith("id:") and line[3:].strip():
                seen.append(int(line[3:].strip()))


async def chaos(run: Run, client: httpx.AsyncClient, duration: float) -> None:
    """Post input and inject faults at seeded random moments for `duration` seconds."""
    rng = run.rng
    ids = list(run.threads)
    schedule: list[tuple[float, str, str | None]] = []
    for tid in ids:
        first = rng.uniform(0, duration * 0.6)
        word = "go"
        if run.threads[tid] == "chaos":
            word = rng.choices(["child", "fan", "kids", "go"], [0.1, 0.2, 0.1, 0.6])[0]
        schedule.append((first, "message", f"{tid}|{word}"))
        if rng.random() < 0.5:  # a second message: mid-turn, right at a turn's end or later
            schedule.append((first + rng.choice([0.05, 0.3, 0.8, 1.5, rng.uniform(2, 10)]), "message", f"{tid}|more"))
    schedule.append((rng.uniform(duration * 0.1, duration * 0.3), "message", f"{ids[0]}|cpu"))
    for kind, count in (("kill", 4), ("term", 3), ("stop", 6), ("terminate", 3)):
        for _ in range(max(1, int(count * duration / 60))):
            schedule.append((rng.uniform(1, duration * 0.9), kind, rng.choice(ids)))
    schedule.append((duration * rng.uniform(0.4, 0.6), "db", None))
    schedule.sort(key=lambda item: item[0])
    started = time.monotonic()
    pending: set[asyncio.Task[None]] = set()
    for at, kind, arg in schedule:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
        task = asyncio.create_task(act(run, client, kind, arg))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)


async def act(run: Run, client: httpx.AsyncClient, kind: str, arg: str | None) -> None:
    rng = run.rng
    if kind == "message":
        assert arg is not None
        tid, word = arg.split("|")
        await post_message(run, client, tid, word)
    elif kind in ("kill", "term"):
        alive = [w for w in run.workers if w.proc is not None and w.proc.poll() is None]
        if len(alive) < 2:
            return
        victim = rng.choice(alive)
        assert victim.proc is not None
        run.faults.victims.add(victim.proc.pid)
        victim.proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        run.faults.killed["kill -9" if kind == "kill" else "SIGTERM"] += 1
        await asyncio.to_thread(victim.proc.wait, 30)
        await asyncio.sleep(rng.uniform(0.2, 2))
        run.worker()
    elif kind == "stop":
        assert arg is not None
        if arg in run.terminated:
            return
        await request(client, "POST", f"/threads/{arg}/stop")
        run.actions["stop"] += 1
        await asyncio.sleep(rng.uniform(0.1, 2))
        if arg not in run.terminated:
            await request(client, "POST", f"/threads/{arg}/continue", json={})
            run.actions["continue"] += 1
    elif kind == "terminate":
        assert arg is not None
        run.terminated.add(arg)
        await request(client, "POST", f"/threads/{arg}/terminate")
        run.actions["terminate"] += 1
    elif kind == "db":
        down = time.time()
        await asyncio.to_thread(run.pg.stop)
        await asyncio.sleep(rng.uniform(1, 3))
        await asyncio.to_thread(run.pg.start)
        run.faults.db_down.append((down, time.time()))
        run.faults.killed["database restart"] += 1


async def settle(conn: asyncpg.Connection, timeout: float) -> bool:
    """Until no thread runs, waits to run or holds a lease (children included)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = await conn.fetchval(
            "SELECT count(*) FROM threads WHERE status IN ('running', 'queued', 'waiting')"
            " OR runnable_since IS NOT NULL OR lease_token IS NOT NULL"
        )
        if busy == 0:
            return True
        await asyncio.sleep(0.5)
    return False


async def check(run: Run, conn: asyncpg.Connection, lease: float) -> list[tuple[str, int, int]]:
    """The invariants: (what, checked, violations)."""
    out: list[tuple[str, int, int]] = []
    live = [tid for tid in run.posted if tid not in run.terminated]
    stored = Counter(str(r["id"]) for r in await conn.fetch("SELECT id FROM messages WHERE role = 'user'"))
    posted = [m for tid in live for m in run.posted[tid]]
    out.append(("user messages stored exactly once", len(posted), sum(stored[m] != 1 for m in posted)))
    pending = await conn.fetchval("SELECT count(*) FROM messages WHERE status = 'pending'")
    total = await conn.fetchval("SELECT count(*) FROM messages")
    out.append(("no message left pending", total, pending))
    calls = await conn.fetch(
        "SELECT m.thread_id, c->>'id' AS call, (SELECT count(*) FROM messages r WHERE r.thread_id = m.thread_id"
        " AND r.tool_call_id = c->>'id') AS answers FROM messages m, jsonb_array_elements(m.tool_calls) c"
        " WHERE m.tool_calls IS NOT NULL AND jsonb_typeof(m.tool_calls) = 'array'"
    )
    out.append(("every tool call answered exactly once", len(calls), sum(r["answers"] != 1 for r in calls)))
    threads = await conn.fetch("SELECT * FROM threads")
    stranded = await conn.fetchval(
        "SELECT count(*) FROM threads t WHERE EXISTS (SELECT 1 FROM inbox i WHERE i.thread_id = t.id"
        " AND i.set_aside_at IS NULL) AND t.lease_token IS NULL AND t.runnable_since IS NULL"
    )
    out.append(("no thread stranded (input, no lease, not runnable)", len(threads), stranded))
    running = sum(t["status"] in ("running", "queued") for t in threads)
    out.append(("no thread left running or queued", len(threads), running))
    aside = await conn.fetchval("SELECT count(*) FROM inbox WHERE set_aside_at IS NOT NULL")
    out.append(("no input set aside", len(posted), aside))
    out.extend(tool_checks(run, lease))
    groups = await conn.fetch(
        "SELECT m.id, count(DISTINCT c.spawn_group_id) AS groups, count(*) - count(c.spawn_group_id) AS ungrouped"
        " FROM messages m JOIN messages r ON r.thread_id = m.thread_id AND r.tool_call_id IN"
        " (SELECT x->>'id' FROM jsonb_array_elements(m.tool_calls) x WHERE x->'function'->>'name' = 'chaos_child')"
        " JOIN threads c ON c.id = r.subagent_id"
        " WHERE m.tool_calls IS NOT NULL AND jsonb_typeof(m.tool_calls) = 'array' GROUP BY m.id HAVING count(*) > 1"
    )
    split = sum(g["groups"] != 1 or g["ungrouped"] > 0 for g in groups)
    out.append(("the children of one answer share one spawn group", len(groups), split))
    gaps = await conn.fetchval(
        "SELECT count(*) FROM threads t WHERE t.event_seq <> (SELECT count(*) FROM events e WHERE e.thread_id = t.id)"
        " OR t.event_seq <> coalesce((SELECT max(seq) FROM events e WHERE e.thread_id = t.id), 0)"
    )
    out.append(("event seqs contiguous per thread", len(threads), gaps))
    bad = 0
    for tid, seen in run.followed.items():
        logged = [r["seq"] for r in await conn.fetch("SELECT seq FROM events WHERE thread_id = $1 ORDER BY seq", tid)]
        bad += seen != logged[: len(seen)] or len(seen) != len(logged)
    out.append(("each resumed SSE transcript equals the stored log", len(run.followed), bad))
    repaired = sum(log.read_text().count("neither leased nor runnable") for log in run.logs.glob("worker-*.log"))
    out.append(("stranded-input repairs by the janitor check", len(run.workers), repaired))
    return out


def cut_off(run: Run) -> set[tuple[int, str]]:
    """(worker pid, thread) of the executions the database restart cut off: the worker says so in its log (the
    result of a call may have been on its way to the database, however long after the call ended)."""
    found: set[tuple[int, str]] = set()
    for path in run.logs.glob("worker-*.log"):
        text = path.read_text()
        started = re.search(r"worker [^:\s]+:(\d+):\S+ started", text)
        if started is not None:
            pid = int(started.group(1))
            found |= {
                (pid, t) for t in re.findall(r"the database is unreachable; thread (\S+) is left to its lease", text)
            }
    return found


def tool_checks(run: Run, lease: float) -> list[tuple[str, int, int]]:
    """Tool executions per call never overlap; each re-execution follows a fault that explains it."""
    path = Path(run.env["CHAOS_DIR"]) / "tools.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        key = (line["thread"], line["call"])
        if line["kind"] == "start":
            runs[key].append({"pid": line["pid"], "start": line["t"], "end": None})
        else:
            match = next(r for r in reversed(runs[key]) if r["pid"] == line["pid"] and r["end"] is None)
            match["end"] = line["t"]
    cut = cut_off(run)
    overlaps = unexplained = again = 0
    for (thread, _), executions in runs.items():
        for before, after in itertools.pairwise(executions):
            again += 1
            end = before["end"] if before["end"] is not None else after["start"]
            if after["start"] < end:
                overlaps += 1
            faulted = (
                before["pid"] in run.faults.victims
                or (before["pid"], thread) in cut
                or any(down - lease <= end and after["start"] >= down for down, _ in run.faults.db_down)
            )
            unexplained += not faulted
    return [
        (f"tool executions never overlap per call ({again} re-executions)", len(runs), overlaps),
        (
            "each re-execution explained by a fault (its worker killed or stopped, or cut off by the database)",
            again,
            unexplained,
        ),
    ]


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    failed = 1
    pg = PrivatePostgres(work / "pg")
    bouncer: PgBouncer | None = None
    try:
        if args.pooler:  # the processes' DATABASE_URL; LISTEN and the harness's own checks go to the server
            (work / "pgbouncer").mkdir()
            bouncer = PgBouncer(pg.url, work / "pgbouncer", pool_size=POOLER_SIZE)
        engine = db.create_engine(dsn.normalise(pg.url), 1)
        await migrations.upgrade(engine)
        await engine.dispose()
        conn = await asyncpg.connect(pg.url)
        setup(
            "R10 — chaos",
            {
                "seed": args.seed,
                "threads": args.threads,
                "duration": f"{args.duration} s",
                "workers": args.workers,
                "pooler": f"PgBouncer, transaction mode, {POOLER_SIZE} server connections" if bouncer else "none",
            },
            await conn.fetchval("SHOW server_version"),
        )
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": bouncer.url(make_url(pg.url).database or "postgres") if bouncer else pg.url,
            **({"DATABASE_DIRECT_URL": pg.url} if bouncer else {}),
            "PORT": str(port),
            "CHAOS_DIR": str(work),
            "LEASE_SECONDS": str(LEASE_SECONDS),
            "POLL_INTERVAL": "0.2",
            "WORKER_CONCURRENCY": "50",
            "CHAOS_SPIN_S": "4",
            "PYTHONHASHSEED": str(args.seed),
        }
        run = Run(rng, f"http://127.0.0.1:{port}", env, work, pg)
        api = Process(["api"], env, work / "api.log", agents=AGENTS)
        api.start()
        for _ in range(args.workers):
            run.worker()
        stop = asyncio.Event()
        try:
            async with httpx.AsyncClient(base_url=run.base, timeout=30) as client:
                await request(client, "GET", "/ready")
                for i in range(args.threads):
                    agent = rng.choices(["chaos", "chaos_duo"], [0.8, 0.2])[0] if i else "chaos"
                    created = await request(client, "POST", "/threads", json={"agent": agent})
                    run.threads[created.json()["id"]] = agent
                followers = [
                    asyncio.create_task(follow(run, tid, stop)) for tid in rng.sample(list(run.threads), args.followers)
                ]
                started = time.monotonic()
                await chaos(run, client, args.duration)
                await conn.close()
                conn = await asyncpg.connect(pg.url)  # the database restart closed the first one
                settled = await settle(conn, args.settle)
                stop.set()
                await asyncio.gather(*followers)
                elapsed = time.monotonic() - started
                results = await check(run, conn, LEASE_SECONDS)
        finally:
            for proc in [api, *run.workers]:
                proc.stop()
        print(f"\nran {elapsed:.0f} s; settled: {'yes' if settled else 'NO'}")
        print("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(run.faults.killed.items())))
        print("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(run.actions.items())))
        print("\n| invariant | checked | violations |\n| --- | --- | --- |")
        for what, checked, violations in results:
            print(f"| {what} | {checked} | {violations} |")
        failed = sum(v for _, _, v in results) + (not settled)
        print(f"\nviolations: {failed}" + ("" if failed else " — clean"))
        await conn.close()
        if failed:
            print(f"logs and database kept in {work}")
        return 1 if failed else 0
    finally:
        if bouncer is not None:
            bouncer.stop()
        pg.cleanup()
        if not failed:
            shutil.rmtree(work, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60, help="seconds of input and faults")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--followers", type=int, default=10, help="SSE clients that drop and resume")
    parser.add_argument("--settle", type=float, default=120, help="seconds allowed to settle afterwards")
    parser.add_argument(
        "--pooler",
        action="store_true",
        help="the processes reach the database through PgBouncer in transaction mode (DATABASE_DIRECT_URL direct)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
