"""The soak (issue 36): an hour of steady traffic on `agents api` + 2 `agents worker`, sampled every minute.

A few hundred clients, each on its own thread of `bench/soak_agents` (the real `openai` provider against B4's model,
bench/peers/fake_llm.py: 300 ms to the first token, 10 chunks 80 ms apart), post a message, follow the turn on the
thread's SSE stream to its end, think a few seconds and post again. A turn calls tools (three 0.5 s `work` calls at
once), a blocking subagent, a tool that keeps a file or one that schedules an effect. A share of the clients drop
their stream at random moments and resume it with `Last-Event-ID`. Worker A runs the whole time; worker B is
restarted every few minutes (SIGTERM and `kill -9` in turn). Every minute: RSS of each process, size, dead tuples
and autovacuum runs of every table, connections, the queue, p50/p99 of first output and turn time
(bench/soak_sample.py). At the end the traffic stops, the threads settle and the chaos harness's invariants are
checked over what is stored (bench/chaos.py). Passes when RSS after the warm-up stays within +10 %, the last
window's latencies are within 20 % of the first's, dead tuples stay bounded and no invariant is violated; the
window is ten minutes, or a third of a shorter run.

    python -m bench.soak                       # the hour, 200 clients
    python -m bench.soak --minutes 4 --clients 100 --restart-every 60      # a smoke run

Postgres: a server of its own (pgserver), started for the run, so that its tables, vacuum and connections are the
soak's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import asyncpg
import httpx

from app import db, dsn, migrations
from bench import soak_sample
from bench.chaos import Run, catch_up, check, post_message, request, settle
from bench.harness import ROOT, PrivatePostgres, Process, free_port, setup
from bench.soak_sample import Sample, Turn

AGENTS = ROOT / "bench" / "soak_agents"
FAKE_LLM = ROOT / "bench" / "peers" / "fake_llm.py"
LEASE_SECONDS = 10.0  # the runtime's default, which the soak keeps
TURN_TIMEOUT = 300.0
MAX_CONNECTIONS = 300  # the soak's own Postgres (`roomy`)
# what a user asks for (fake_llm.py reads `call:`): three `work` calls at once, or one, a subagent, a file, an effect
WORDS = {"go": 0.5, "call:work": 0.1, "call:soak_child": 0.1, "call:keep_file,work": 0.2, "call:later": 0.1}


class SoakRun(Run):
    """The chaos harness's record of a run, its workers serving the soak's agents."""

    def worker(self) -> Process:
        self.spawned += 1
        proc = Process(["worker"], self.env, self.logs / f"worker-{self.spawned}.log", agents=AGENTS)
        proc.start()
        self.workers.append(proc)
        return proc


class Client:
    """One user: a thread, its SSE stream (dropped and resumed when `dropper`), and the turns it measured."""

    def __init__(self, run: Run, tid: str, rng: random.Random, dropper: bool) -> None:
        self.run, self.tid, self.rng, self.dropper = run, tid, rng, dropper
        self.seen = run.followed.setdefault(tid, [])
        self.events: asyncio.Queue[tuple[float, str, str]] = asyncio.Queue()
        self.breaks = 0  # streams ended (dropped on purpose or lost): a turn across one is not timed
        self.reading: asyncio.Task[None] | None = None

    def follow(self) -> asyncio.Task[None]:
        """Start following the current thread's stream."""
        self.reading = asyncio.create_task(self.read())
        return self.reading

    async def new_thread(self, http: httpx.AsyncClient) -> None:
        """A new conversation, as users start one: the next turns go to a new thread (the old one is kept, and its
        stream read to its end at the check)."""
        created = await request(http, "POST", "/threads", json={"agent": "soak"})
        if self.reading is not None:
            self.reading.cancel()
            await asyncio.gather(self.reading, return_exceptions=True)
        self.tid = created.json()["id"]
        self.run.threads[self.tid] = "soak"
        self.seen = self.run.followed.setdefault(self.tid, [])
        self.events = asyncio.Queue()
        self.run.actions["new thread"] += 1
        self.follow()

    async def read(self) -> None:
        """Follow the thread's stream for good (cancelled at the end), resuming after the last event seen."""
        async with httpx.AsyncClient(base_url=self.run.base, timeout=httpx.Timeout(10, read=None)) as http:
            while True:
                headers = {"Last-Event-ID": str(self.seen[-1])} if self.seen else {}
                until = time.monotonic() + self.rng.uniform(5, 60) if self.dropper else math.inf
                with contextlib.suppress(httpx.TransportError):
                    async with http.stream("GET", f"/threads/{self.tid}/events", headers=headers) as response:
                        if response.status_code == 200:
                            await self._lines(response, until)
                self.breaks += 1
                await asyncio.sleep(self.rng.uniform(0.05, 0.5))

    async def _lines(self, response: httpx.Response, until: float) -> None:
        kind, data, seq = "message", list[str](), None
        async for line in response.aiter_lines():
            if line:
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "id" and value:
                    seq = int(value)
                elif key == "event":
                    kind = value
                elif key == "data":
                    data.append(value)
                continue
            if seq is not None:
                self.seen.append(seq)
            if data:
                self.events.put_nowait((time.monotonic(), kind, "\n".join(data)))
            kind, data, seq = "message", [], None
            if time.monotonic() > until:
                self.run.actions["sse drop"] += 1
                return

    async def talk(
        self, stop: asyncio.Event, think: float, turns: list[Turn], errors: Counter[str], per_thread: int
    ) -> None:
        """Post, follow the turn to its end, think, again, until `stop`; a new thread after `per_thread` turns."""
        async with httpx.AsyncClient(base_url=self.run.base, timeout=30) as http:
            posted = 0
            while not stop.is_set():
                if posted and posted % per_thread == 0:
                    await self.new_thread(http)
                posted += 1
                word = self.rng.choices(list(WORDS), list(WORDS.values()))[0]
                while not self.events.empty():
                    self.events.get_nowait()  # what the thread said since the last turn (an effect's events)
                breaks, t0 = self.breaks, time.monotonic()
                try:
                    await post_message(self.run, http, self.tid, word)
                    first, ended = await self._turn(t0)
                except (RuntimeError, TimeoutError) as exc:
                    errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
                    await asyncio.sleep(1)
                    continue
                if self.breaks == breaks:
                    turns.append(Turn(ended, first - t0, ended - t0, word))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.rng.expovariate(1 / think))

    async def _turn(self, t0: float) -> tuple[float, float]:
        """(first output, end) of the turn just posted: the first chunk or assistant message, then `idle`."""
        first: float | None = None
        started = False
        async with asyncio.timeout(TURN_TIMEOUT):
            while True:
                at, kind, data = await self.events.get()
                if first is None and (kind == "message_chunk" or (kind == "message_data" and _is_output(data))):
                    first = at
                elif kind == "thread_status":
                    status = json.loads(data).get("status")
                    started = started or status in ("queued", "running")
                    if status == "idle" and started and first is not None:
                        return first, at


def _is_output(data: str) -> bool:
    message = json.loads(data).get("data") or {}
    return message.get("role") == "assistant" and bool(message.get("content") or message.get("tool_calls"))


async def restarts(run: Run, every: float, stop: asyncio.Event) -> None:
    """Restart worker B (the newest) every `every` seconds, SIGTERM and `kill -9` in turn."""
    for n in range(1_000_000):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
            return
        victim = run.workers[-1].proc
        assert victim is not None
        run.faults.victims.add(victim.pid)
        kind = "SIGTERM" if n % 2 == 0 else "kill -9"
        victim.send_signal(signal.SIGTERM if n % 2 == 0 else signal.SIGKILL)
        run.faults.killed[kind] += 1
        await asyncio.to_thread(victim.wait, 30)
        run.worker()


async def sampling(
    conn: asyncpg.Connection, run: Run, api: Process, every: float, stop: asyncio.Event, turns: list[Turn],
    samples: list[Sample], out: Path | None,
) -> None:  # fmt: skip
    """A sample every `every` seconds until `stop`, printed as it is taken."""
    started = time.monotonic()
    print("\n" + "\n".join(soak_sample.minute_table([], ["worker A", "worker B"])), flush=True)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every - (time.monotonic() - started) % every)
        pids = {"api": _pid(api), "worker A": _pid(run.workers[0]), "worker B": _pid(run.workers[-1])}
        taken, turns[:] = turns[:], []
        sample = await soak_sample.take(conn, started, pids, taken)
        samples.append(sample)
        print(soak_sample.minute_table([sample], ["worker A", "worker B"])[-1], flush=True)
        if out is not None:
            with out.open("a") as f:
                f.write(json.dumps(sample.row()) + "\n")


def _pid(process: Process) -> int | None:
    return process.proc.pid if process.proc is not None else None


async def roomy(pg: PrivatePostgres) -> None:
    """Room for every process's pool: at the default settings a worker keeps WORKER_CONCURRENCY + 4 connections
    (54) and the API 20 and a listener, ~140 in all (and a restarted worker's new pool may open before the old one's
    backends are gone), past Postgres's default `max_connections` of 100."""
    conn = await asyncpg.connect(pg.url)
    try:
        await conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
    finally:
        await conn.close()
    await asyncio.to_thread(pg.stop)
    await asyncio.to_thread(pg.start)


def fake_llm(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """B4's model server as a process of its own (its CPU is not the client's); its base URL."""
    port = free_port()
    with (folder / "fake-llm.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(FAKE_LLM), "--port", str(port), "--tool-name", "work"], stdout=log, stderr=log
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc, f"http://127.0.0.1:{port}/v1"
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"fake_llm.py did not start: {(folder / 'fake-llm.log').read_text()}")


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    pg = PrivatePostgres(work / "pg")
    model, llm_url = fake_llm(work)
    failed = 1
    try:
        await roomy(pg)
        engine = db.create_engine(dsn.normalise(pg.url), 1)
        await migrations.upgrade(engine)
        await engine.dispose()
        conn = await asyncpg.connect(pg.url)
        window = max(1, min(10, args.minutes // 3)) * 60 / args.sample_every
        settings = {
            "minutes": args.minutes, "clients": f"{args.clients} ({args.droppers:.0%} drop and resume their stream)",
            "think": f"{args.think} s (mean, exponential)",
            "conversation": f"{args.turns_per_thread} turns a thread",
            "restarts": f"worker B every {args.restart_every} s",
            "window": f"{window * args.sample_every / 60:.0f} min (warm-up, and each end's latency window)",
            "model": "bench/peers/fake_llm.py (300 ms TTFT, 10 chunks 80 ms apart), tools 0.5 s",
            "server": f"Postgres of its own, max_connections {MAX_CONNECTIONS}", "seed": args.seed,
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        }  # fmt: skip
        os.environ.pop("DATABASE_URL", None)  # the processes get the soak's own server; `setup` says "embedded"
        setup("Soak — issue 36", settings, await conn.fetchval("SHOW server_version"))
        port = free_port()
        env = {**os.environ, "DATABASE_URL": pg.url, "PORT": str(port), "CHAOS_DIR": str(work), "SOAK_LLM_URL": llm_url}
        if args.worker_concurrency:
            env["WORKER_CONCURRENCY"] = str(args.worker_concurrency)
        run = SoakRun(rng, f"http://127.0.0.1:{port}", env, work, pg)
        api = Process(["api"], env, work / "api.log", agents=AGENTS)
        api.start()
        run.worker()  # A: the whole run
        run.worker()  # B: restarted
        samples: list[Sample] = []
        errors: Counter[str] = Counter()
        try:
            async with httpx.AsyncClient(base_url=run.base, timeout=30) as http:
                await request(http, "GET", "/ready")
                for _ in range(args.clients):
                    created = await request(http, "POST", "/threads", json={"agent": "soak"})
                    run.threads[created.json()["id"]] = "soak"
            clients = [
                Client(run, tid, random.Random(rng.random()), rng.random() < args.droppers) for tid in run.threads
            ]
            for c in clients:
                c.follow()
            stop, turns = asyncio.Event(), list[Turn]()
            talkers = [
                asyncio.create_task(c.talk(stop, args.think, turns, errors, args.turns_per_thread)) for c in clients
            ]
            background = [
                asyncio.create_task(restarts(run, args.restart_every, stop)),
                asyncio.create_task(sampling(conn, run, api, args.sample_every, stop, turns, samples, args.out)),
            ]
            await asyncio.sleep(args.minutes * 60)
            stop.set()
            await asyncio.gather(*background)
            await asyncio.wait(talkers, timeout=TURN_TIMEOUT)
            settled = await settle(conn, args.settle)
            readers = [c.reading for c in clients if c.reading is not None]
            for task in [*readers, *talkers]:
                task.cancel()
            await asyncio.gather(*readers, *talkers, return_exceptions=True)
            async with httpx.AsyncClient(base_url=run.base, timeout=httpx.Timeout(10, read=None)) as http:
                gate = asyncio.Semaphore(50)

                async def last_read(tid: str) -> None:
                    async with gate:
                        await catch_up(http, tid, run.followed[tid])

                await asyncio.gather(*(last_read(tid) for tid in run.threads))
            invariants = await check(run, conn, LEASE_SECONDS)
        finally:
            for proc in [api, *run.workers]:
                proc.stop()
        failed = report(samples, int(window), invariants, settled, run, errors)
        await conn.close()
        if failed:
            print(f"logs and database kept in {work}")
        return 1 if failed else 0
    finally:
        model.terminate()
        model.wait(10)
        pg.cleanup()
        if not failed:
            shutil.rmtree(work, ignore_errors=True)


def report(
    samples: list[Sample], window: int, invariants: list[tuple[str, int, int]], settled: bool, run: Run,
    errors: Counter[str],
) -> int:  # fmt: skip
    """Print the tables and the verdict; the number of failed checks."""
    print(f"\nturns timed {sum(len(s.turns) for s in samples)}; settled: {'yes' if settled else 'NO'}")
    print("faults: " + ", ".join(f"{k} {v}" for k, v in sorted(run.faults.killed.items())))
    print("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(run.actions.items())))
    if errors:
        print("client errors: " + ", ".join(f"{k} × {v}" for k, v in errors.most_common()))
    if samples:
        print("\n" + "\n".join(soak_sample.kinds_table(samples)))
        print("\n" + "\n".join(soak_sample.table_table(samples[0], samples[-1])))
    verdicts = soak_sample.verdicts(samples, window, ["api", "worker A"])
    print("\n| figure | measured | met |\n| --- | --- | --- |")
    for v in verdicts:
        print(f"| {v.what} | {v.figure} | {'yes' if v.ok else 'NO'} |")
    print("\n| invariant | checked | violations |\n| --- | --- | --- |")
    for what, checked, violations in invariants:
        print(f"| {what} | {checked} | {violations} |")
    failed = sum(not v.ok for v in verdicts) + sum(v > 0 for _, _, v in invariants) + (not settled) + bool(errors)
    print(f"\n{'PASSED' if not failed else f'FAILED: {failed} check(s)'}")
    return failed


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60, help="minutes of traffic")
    parser.add_argument("--clients", type=int, default=200, help="users, each on a thread of its own")
    parser.add_argument("--think", type=float, default=5.0, help="mean seconds between a turn's end and the next post")
    parser.add_argument(
        "--turns-per-thread",
        type=int,
        default=30,
        help="turns a client takes on a thread before it starts a new one (a conversation's length)",
    )
    parser.add_argument("--droppers", type=float, default=0.2, help="share of clients that drop and resume streams")
    parser.add_argument("--restart-every", type=float, default=240, help="seconds between restarts of worker B")
    parser.add_argument("--sample-every", type=float, default=60, help="seconds between samples")
    parser.add_argument("--settle", type=float, default=180, help="seconds allowed to settle afterwards")
    parser.add_argument("--worker-concurrency", type=int, help="WORKER_CONCURRENCY (default: the runtime's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="append each sample to this file as a JSON line")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
