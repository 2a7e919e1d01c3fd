"""Scale-out on paper and in part (issue 34): where a step's CPU goes with API and worker processes apart, what
Postgres alone allows for the step's statements over N connections, and what 1 API + 8 workers on 8 cores would reach.

1. **Load**: `agents api` + 1, then + 2, `agents worker` processes on a fresh database of a Postgres of the script's
   own (`bench.statements.counting_postgres`: `pg_stat_statements`, fsync off), under B2's load: `--clients` users
   each on a thread, posting tool runs back to back (2 LLM steps each on the zero-latency `test` model: a call of a
   tool, then the answer) and following each on the thread's SSE stream. The client is `bench/statements.py`'s
   (`User`: a bare-socket stream each, the `steps` agent of `bench/agents` told `steps 1`), or with `--client peers`
   the peer benchmark's (`bench/peers/bench_client.py`, the `tool` agent of `bench/peers/agents`), whose `--graph
   stream` is B4 (the real `openai` provider against `bench/peers/fake_llm.py`). CPU seconds of each process group
   over the window (the API process, the workers, Postgres's processes with the backends they reaped, the client),
   from `/proc`, per LLM step.
2. **Postgres alone**: the statements of `--capture-runs` tool runs (one client, `api` + one `worker`), logged by
   Postgres with their parameters, replayed by pgbench with N = `--connections` clients (`bench/replay.py` says how
   the replay keeps N clients off each other's rows): runs/s, commits/s and Postgres's CPU per step.
3. **Projection** (`bench/projection.py`, its assumptions there): this box's 2 cores checked against what was
   measured, then 1 API + 8 workers on 8 cores, Postgres on the same cores or on cores of its own.

    .venv/bin/python -m bench.scaleout [--clients 50] [--seconds 12] [--workers 1 2] [--connections 1 2 4 8 16]
        [--replay-seconds 4] [--client light|peers] [--graph tool|stream]          # ~2 min with the defaults

The machine's load (`uptime`) is printed beside each part: on a shared box, read the figures with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench import projection, replay
from bench.harness import AGENTS as LIGHT_AGENTS
from bench.harness import ROOT, database, free_port, servers, setup
from bench.peers.adapters import Adapter, StandardAgentsAdapter
from bench.peers.bench_client import STEPS_PER_RUN, run_b2
from bench.peers.resources import _children_map, _tree, read_text
from bench.statements import BIN, User, counting_postgres

AGENTS = ROOT / "bench" / "peers" / "agents"
FAKE_LLM = ROOT / "bench" / "peers" / "fake_llm.py"
MAX_RUNS = 1_000_000  # per client: the duration bounds a load, not a count
DRAIN = 30.0  # seconds the runs in flight at the end may take


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _times(pid: int) -> tuple[float, float]:
    """A process's own user + system CPU seconds, and those of the children it reaped (`/proc/<pid>/stat`)."""
    stat = read_text(f"/proc/{pid}/stat")
    if not stat:
        return 0.0, 0.0
    f = stat.rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(f[11]) + int(f[12])) / tick, (int(f[13]) + int(f[14])) / tick


def tree_cpu(roots: list[int]) -> float:
    """User + system CPU seconds of these processes, their descendants, and the descendants they reaped (Postgres's
    backends that exited): a process's own times plus its reaped children's, every process once."""
    kids = _children_map()
    return sum(sum(_times(p)) for p in {p for root in roots for p in _tree(root, kids)})


def machine_busy() -> float:
    """CPU seconds all cores spent not idle since boot (`/proc/stat`): what every process on the box used."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> tuple[float, float]:
    """This process's CPU seconds (the load's client), and those of the children it reaped (pgbench)."""
    return _times(os.getpid())


class Meter:
    """CPU seconds of process groups (each a list of root pids), of this process (`client`), of the children it
    reaped (`reaped`) and of the whole machine over a window. This process's running children (the servers) count
    in their own groups only."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        out = {name: tree_cpu(pids) for name, pids in self.groups.items()}
        out["client"], out["reaped"] = own_cpu()
        out["machine"], out["wall"] = machine_busy(), time.monotonic()
        return out

    def stop(self) -> dict[str, float]:
        end = self._read()
        return {k: end[k] - self.start[k] for k in end}


async def postmaster(admin: asyncpg.Connection) -> int:
    """The Postgres server's main process: the parent of a backend."""
    backend = await admin.fetchval("SELECT pg_backend_pid()")
    return int(read_text(f"/proc/{backend}/stat").rsplit(")", 1)[1].split()[1])


async def statement_totals(admin: asyncpg.Connection, database_name: str) -> tuple[int, float, int]:
    """Statements run, their execution ms (`pg_stat_statements`, top level) and commits of `database_name`."""
    oid = await admin.fetchval("SELECT oid FROM pg_database WHERE datname = $1", database_name)
    row = await admin.fetchrow(
        "SELECT coalesce(sum(calls), 0) AS calls, coalesce(sum(total_exec_time), 0) AS ms FROM pg_stat_statements "
        "WHERE dbid = $1 AND toplevel AND query NOT LIKE '%pg_stat%'",
        oid,
    )
    commits = await admin.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datid = $1", oid)
    assert row is not None
    return int(row["calls"]), float(row["ms"]), int(commits or 0)


async def _adapter(http: httpx.AsyncClient, graph: str) -> Adapter:
    adapter = StandardAgentsAdapter(http, graph, "events")
    await adapter.setup()
    return adapter


async def light_b2(users: list[User], seconds: float) -> dict[str, Any]:
    """B2 with the light client of `bench/statements.py` (a bare-socket stream per user, one HTTP pool for the
    posts): each user posts tool runs back to back, each followed on its stream to its end, for `seconds`; the runs
    in flight then finish (counted apart). `run_b2`'s figures."""
    done = {"window": 0, "drain": 0}
    errors: list[str] = []
    stop_at = time.monotonic() + seconds

    async def turns(user: User) -> None:
        while time.monotonic() < stop_at:
            try:
                await user.tool_run()
            except (TimeoutError, httpx.HTTPError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(0.05)  # as run_b2: no spin on a server that refuses
                continue
            done["window" if time.monotonic() <= stop_at else "drain"] += 1

    await asyncio.gather(*(turns(u) for u in users))
    return {
        "completed_runs": done["window"],
        "completed_in_drain": done["drain"],
        "llm_steps_per_s": done["window"] * 2 / seconds,
        "errors": len(errors),
        "unfinished_at_drain": 0,
    }


async def load(
    server: str, admin: asyncpg.Connection, workers: int, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """One load on `api` + `workers` workers, fresh database: steps/s and CPU ms per step of each group."""
    steps_per_run = STEPS_PER_RUN[args.graph]
    light = args.client == "light"
    pids: list[int] = []
    async with database(server) as url:
        name = url.rsplit("/", 1)[1]
        commands = [["api"], *[["worker"]] * workers]
        async with (
            servers(url, commands, env, pids, agents=LIGHT_AGENTS if light else AGENTS) as base,
            httpx.AsyncClient(base_url=base, timeout=60) as http,
        ):
            await asyncio.sleep(2)  # the workers' start-up (the API answered /ready)
            users = [User(http, base, 1) for _ in range(args.clients if light else 0)]
            await asyncio.gather(*(u.open() for u in users))
            adapter = await _adapter(http, args.graph)
            if light:
                await light_b2(users, 3.0)  # warm-up
            else:
                await run_b2(adapter, min(args.clients, 20), 3.0, MAX_RUNS, DRAIN, steps_per_run)
            await admin.execute("SELECT pg_stat_statements_reset()")
            calls0, ms0, commits0 = await statement_totals(admin, name)
            groups = {"api": pids[:1], "workers": pids[1:], "postgres": [await postmaster(admin)]}
            meter = Meter(groups)
            if light:
                b2 = await light_b2(users, args.seconds)
            else:
                b2 = await run_b2(adapter, args.clients, args.seconds, MAX_RUNS, DRAIN, steps_per_run)
            used = meter.stop()
            calls, ms, commits = await statement_totals(admin, name)
            await asyncio.gather(*(u.close() for u in users))
    steps = (b2["completed_runs"] + b2["completed_in_drain"]) * steps_per_run
    out: dict[str, Any] = {
        "workers": workers,
        "steps_per_s": b2["llm_steps_per_s"],
        "steps": steps,
        "errors": b2["errors"],
        "unfinished": b2["unfinished_at_drain"],
        "load": load_average(),
        "wall_s": used["wall"],
        "statements_per_step": (calls - calls0) / steps if steps else 0.0,
        "exec_ms_per_step": (ms - ms0) / steps if steps else 0.0,
        "commits_per_step": (commits - commits0) / steps if steps else 0.0,
    }
    for group in (*groups, "client", "machine"):
        out[f"{group}_ms"] = projection.per_step(used[group], steps)
        out[f"{group}_cores"] = used[group] / used["wall"]
    out["others_cores"] = out["machine_cores"] - sum(out[f"{g}_cores"] for g in (*groups, "client"))
    return out


async def capture(url: str, admin: asyncpg.Connection, runs: int, env: dict[str, str]) -> str:
    """Log the statements of `runs` tool runs on one thread of database `url` (one client, `api` + one `worker`);
    the pgbench script made of them (`bench/replay.py`)."""
    data = Path(str(await admin.fetchval("SHOW data_directory")))
    async with (
        servers(url, [["api"], ["worker"]], env, agents=AGENTS) as base,
        httpx.AsyncClient(base_url=base, timeout=60) as http,
    ):
        adapter = await _adapter(http, "tool")
        thread = await adapter.create_thread()
        session = await adapter.open_session(thread)
        for _ in range(3):  # warm-up: the connections' first statements (type look-ups) stay out
            await adapter.run(thread, session, time.perf_counter())
        marker = await asyncpg.connect(url)
        for key, value in {**replay.capture_settings(), "log_statement": "all"}.items():
            await admin.execute(f"ALTER SYSTEM SET {key} = '{value}'")
        await admin.execute("SELECT pg_reload_conf()")
        await asyncio.sleep(0.5)
        try:
            await marker.execute(f"SELECT '{replay.MARK}'")
            for _ in range(runs):
                timing = await adapter.run(thread, session, time.perf_counter())
                if not timing.ok:
                    raise SystemExit(f"a captured run failed: {timing.error}")
            await asyncio.sleep(0.5)  # the last release
            await marker.execute(f"SELECT '{replay.MARK}'")
        finally:
            await marker.close()
            await admin.execute("ALTER SYSTEM RESET ALL")
            await admin.execute("SELECT pg_reload_conf()")
        await adapter.close_session(session)
    captured = replay.parse_log((data.parent / "log").read_text(errors="replace"), url.rsplit("/", 1)[1])
    if not captured:
        raise SystemExit("no statement captured (is the server's log at <data>/../log?)")
    return replay.script(captured, thread)


async def replays(
    url: str, admin: asyncpg.Connection, script: str, runs: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """pgbench over the captured runs at each N: runs/s, commits/s, CPU ms per step of Postgres and of pgbench."""
    binary = sorted(BIN.glob("*/bin/pgbench"))[-1]
    folder = Path(tempfile.mkdtemp(prefix="bench-scaleout-"))
    path = folder / "run.sql"
    path.write_text(script)
    name = url.rsplit("/", 1)[1]
    groups = {"postgres": [await postmaster(admin)]}
    conn = await asyncpg.connect(url)
    out = []
    for n in args.connections:
        _, _, commits0 = await statement_totals(admin, name)
        messages0 = await conn.fetchval("SELECT count(*) FROM messages")
        meter = Meter(groups)
        bench = await asyncio.to_thread(replay.pgbench, binary, url, path, n, args.replay_seconds)
        used = meter.stop()
        _, _, commits = await statement_totals(admin, name)
        messages = await conn.fetchval("SELECT count(*) FROM messages") - messages0
        steps_per_s = bench.tps * runs * 2
        steps = steps_per_s * used["wall"]
        out.append({
            "connections": n, "runs_per_s": bench.tps * runs, "steps_per_s": steps_per_s, "failed": bench.failed,
            "commits_per_s": (commits - commits0) / used["wall"], "load": load_average(),
            "messages_per_run": messages / max(bench.tps * runs * used["wall"], 1e-9),
            "postgres_ms": projection.per_step(used["postgres"], round(steps)),
            "postgres_cores": used["postgres"] / used["wall"], "pgbench_cores": used["reaped"] / used["wall"],
            "others_cores": (used["machine"] - used["postgres"] - used["reaped"]) / used["wall"],
        })  # fmt: skip
    await conn.close()
    return out


@contextlib.contextmanager
def fake_llm() -> Any:
    """B4's model server on a free port, for `--graph stream`: the environment that points the `stream` agent at it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE_LLM), "--port", str(port)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            time.sleep(0.1)
        yield {"FAKE_LLM_URL": f"http://127.0.0.1:{port}/v1"}
    finally:
        proc.terminate()
        proc.wait(10)


LOAD_HEAD = (
    "| api + workers | LLM steps/s | CPU ms per step: api | workers | postgres | client | machine busy (cores) | "
    "of it other processes | statements / commits / Postgres exec ms per step | errors | load |"
)
REPLAY_HEAD = (
    "| connections | tool runs/s | LLM steps/s | commits/s | messages per run | Postgres CPU ms per step | "
    "Postgres cores | pgbench cores | other processes (cores) | failed | load |"
)


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells) + " |"


def report(loads: list[dict[str, Any]], benches: list[dict[str, Any]], graph: str) -> None:
    print(f"\n## load ({graph}): CPU ms per LLM step by process group\n{LOAD_HEAD}\n" + "| --- " * 11 + "|")
    for r in loads:
        statements = f"{r['statements_per_step']:.1f} / {r['commits_per_step']:.1f} / {r['exec_ms_per_step']:.1f}"
        cells = [f"1 + {r['workers']}", round(r["steps_per_s"], 1), r["api_ms"], r["workers_ms"], r["postgres_ms"]]
        print(_row([*cells, r["client_ms"], r["machine_cores"], r["others_cores"], statements, r["errors"], r["load"]]))
    if benches:
        print(f"\n## Postgres alone: the captured tool runs replayed by pgbench\n{REPLAY_HEAD}\n" + "| --- " * 11 + "|")
        for b in benches:
            rates = [b["connections"], round(b["runs_per_s"]), round(b["steps_per_s"]), round(b["commits_per_s"])]
            cpu = [b["postgres_ms"], b["postgres_cores"], b["pgbench_cores"], b["others_cores"]]
            print(_row([*rates, b["messages_per_run"], *cpu, b["failed"], b["load"]]))
    print("\n## projection (bench/projection.py)")
    for r in loads:
        cost = projection.PerStep(r["api_ms"], r["workers_ms"], r["postgres_ms"], r["client_ms"])
        ours = max(0.1, (os.cpu_count() or 1) - r["others_cores"])
        here = projection.ceiling(cost, ours, r["workers"], client_shares=True)
        print(
            f"this box, 1 + {r['workers']}: measured {r['steps_per_s']:.1f} steps/s; predicted on the "
            f"{ours:.2f} cores the other processes left {here.steps_per_s:.0f} ({here.bound})"
        )
    last = max(loads, key=lambda r: int(r["workers"]))  # the most workers: their costs project
    cost = projection.PerStep(last["api_ms"], last["workers_ms"], last["postgres_ms"])
    replayed = None
    if benches:
        best = max(benches, key=lambda b: b["steps_per_s"])
        replayed = projection.per_core(best["steps_per_s"], best["postgres_cores"])
        print(
            f"Postgres alone: at most {best['steps_per_s']:.0f} steps/s here ({best['connections']} connections), "
            f"{replayed:.0f} steps/s per core of Postgres CPU"
        )
    print(
        f"per step (1 + {last['workers']}): api {cost.api:.2f}, worker {cost.worker:.2f}, postgres "
        f"{cost.postgres:.2f} ms of CPU; Postgres per core at load {1000 / cost.postgres:.0f} steps/s"
    )
    shapes: list[tuple[str, float | None, float | None]] = [("Postgres on the same 8 cores", None, None)]
    for pg_cores in (2.0, 4.0, 8.0):
        shapes.append((f"Postgres on {pg_cores} cores of its own (load's cost)", pg_cores, None))
        if replayed:
            shapes.append((f"Postgres on {pg_cores} cores of its own (replay's cost)", pg_cores, replayed))
    for label, on_own, pg_per_core in shapes:
        c = projection.ceiling(cost, 8, 8, on_own, pg_per_core)
        bounds = ", ".join(f"{k} {v:.0f}" for k, v in c.bounds.items())
        print(f"1 API + 8 workers on 8 cores, {label}: {c.steps_per_s:.0f} steps/s, bound by {c.bound} ({bounds})")
    apis, workers, best_c = projection.best_split(cost, 8, 8)
    print(
        f"best split of 8 cores (Postgres on 8 of its own): {apis} API + {workers} workers, {best_c.steps_per_s:.0f} "
        f"steps/s, bound by {best_c.bound}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=12.0, help="each load's window")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--graph", choices=["tool", "stream"], default="tool", help="stream: B4 (fake_llm.py)")
    parser.add_argument(
        "--client",
        choices=["light", "peers"],
        default="light",
        help="light: bench/statements.py's users (a bare-socket stream each, the `steps` agent told `steps 1`); peers: "
        "the peer benchmark's (httpx streams, its `tool` or `stream` agent)",
    )
    parser.add_argument("--connections", type=int, nargs="*", default=[1, 2, 4, 8, 16], help="none: no replay")
    parser.add_argument("--replay-seconds", type=int, default=4)
    parser.add_argument("--capture-runs", type=int, default=5)
    args = parser.parse_args()
    if args.graph == "stream" and args.client == "light":
        parser.error("--graph stream needs --client peers")
    with counting_postgres() as server, contextlib.ExitStack() as stack:
        env = stack.enter_context(fake_llm()) if args.graph == "stream" else {}
        admin = await asyncpg.connect(server)
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        version = str(await admin.fetchval("SHOW server_version"))
        settings = {
            "clients": f"{args.clients} ({args.client} client)",
            "seconds": args.seconds,
            "workers": args.workers,
            "graph": args.graph,
            "server": "defaults (DB_POOL_SIZE 20, WORKER_CONCURRENCY 1000, WORKER_ACTIVE 50)",
            "postgres": "fsync off, synchronous_commit off",
            "load": load_average(),
        }
        setup("scale-out", settings, version)
        loads = []
        for workers in args.workers:
            loads.append(await load(server, admin, workers, args, env))
            print(f"load 1 + {workers}: {loads[-1]['steps_per_s']:.1f} steps/s, load {loads[-1]['load']}", flush=True)
        benches: list[dict[str, Any]] = []
        if args.connections:
            async with database(server) as url:
                script = await capture(url, admin, args.capture_runs, env)
                benches = await replays(url, admin, script, args.capture_runs, args)
        await admin.close()
    report(loads, benches, args.graph)


if __name__ == "__main__":
    asyncio.run(main())
