"""Bytes per turn, per table, and how the hot tables' updates fare (issue 36).

A Postgres server of the script's own (as `bench.statements`), a fresh migrated database, one `agents serve` process
with `bench/agents`, and `--clients` chat clients of the `steps` agent, each on its own thread with its stream open:
first `--tool-turns` turns that call the `noop` tool once ("steps 1": the message, an LLM step calling the tool, its
result, a second LLM step answering), then `--plain-turns` turns that answer at once. After each phase every table is
VACUUMed and measured: its size on disk (`pg_total_relation_size`: heap, indexes, TOAST) and its rows; the growth is
divided by the phase's turns. Then the statistics of the whole load: updates, HOT updates (an update that touches no
indexed column and finds room on its page writes no index entry and leaves a dead tuple that page pruning reclaims)
and dead tuples left, per table. Last, the retention sweeps run (`app/retention.py`) with every age at zero, as if
every setting had passed, and what is left per turn is what users keep.

    .venv/bin/python -m bench.storage [--tool-turns 1000] [--plain-turns 300] [--clients 10] [--untuned]

`--untuned` resets the storage parameters migration 0018 sets (fillfactor, per-table autovacuum): the figures before.
`--idle-threads N` stores N threads that never run before the load, so `threads` has a realistic size (autovacuum's
default threshold is a fifth of a table's rows: on a table of 20 rows it runs every minute anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

import asyncpg
import httpx

from app import db, retention
from app.settings import Settings
from bench.harness import database, servers, setup
from bench.statements import User, counting_postgres, runs

# the tables migration 0018 tunes, and what `--untuned` resets
TUNED = ("threads", "leases", "inbox", "metrics", "counters")
PARAMETERS = (
    "fillfactor",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_analyze_scale_factor",
)

_SIZES = """
    SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes, s.n_live_tup AS rows
    FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE c.relkind = 'r' AND s.schemaname = 'public' AND c.relname <> 'alembic_version'
"""
_IDLE = """
    INSERT INTO threads (id, agent, type, user_id, name, created_at, updated_at, last_message_at)
    SELECT gen_random_uuid(), 'steps', 'ai_human', 'idle-' || (n % 1000), 'an idle thread', now(), now(), now()
    FROM generate_series(1, $1) n
"""
_STATS = """
    SELECT relname AS name, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup, autovacuum_count
    FROM pg_stat_user_tables WHERE schemaname = 'public'
"""


@dataclass
class Table:
    bytes: int  # on disk: heap, indexes, TOAST, free space included
    rows: int
    data: int = 0  # the rows' own bytes (`pg_column_size` of each row, as stored: compressed)


async def measure(conn: asyncpg.Connection) -> dict[str, Table]:
    """Every table's size on disk and exact row count, after a VACUUM (sizes count what is live and what is free)."""
    await conn.execute("VACUUM")
    await conn.execute("ANALYZE")
    found: dict[str, Table] = {}
    for row in await conn.fetch(_SIZES):
        counted = await conn.fetchrow(
            f'SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0) FROM "{row["name"]}" t'  # noqa: S608 -- catalog
        )
        assert counted is not None
        found[row["name"]] = Table(int(row["bytes"]), int(counted[0]), int(counted[1]))
    return found


async def untune(conn: asyncpg.Connection) -> None:
    for table in TUNED:
        await conn.execute(f"ALTER TABLE {table} RESET ({', '.join(PARAMETERS)})")


async def sweep_everything(url: str) -> dict[str, int]:
    """Run every retention rule once with its age at zero: what is not the conversation goes."""
    settings = Settings(database_url=url)
    engine = db.create_engine(url, 2)
    sessions = db.sessionmaker(engine)
    gone: dict[str, int] = {}
    try:
        for rule in retention.rules(settings):
            gone[rule.what] = await retention.sweep(sessions, rule.now())
    finally:
        await engine.dispose()
    return gone


def per_turn(before: dict[str, Table], after: dict[str, Table], turns: int, name: str) -> tuple[float, float, float]:
    b, a = before.get(name, Table(0, 0)), after.get(name, Table(0, 0))
    return (a.bytes - b.bytes) / turns, (a.rows - b.rows) / turns, (a.data - b.data) / turns


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool-turns", type=int, default=1000)
    parser.add_argument("--plain-turns", type=int, default=300)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--untuned", action="store_true", help="reset the storage parameters of migration 0018")
    parser.add_argument(
        "--idle-threads", type=int, default=0, help="threads stored beforehand, never run: a table of realistic size"
    )
    args = parser.parse_args()
    with counting_postgres() as server:
        admin = await asyncpg.connect(server)
        version = str(await admin.fetchval("SHOW server_version"))
        await admin.close()
        settings = {k: getattr(args, k) for k in ("tool_turns", "plain_turns", "clients", "untuned", "idle_threads")}
        setup("bytes per turn", settings, version)
        async with database(server) as url:
            conn = await asyncpg.connect(url)
            if args.untuned:
                await untune(conn)
            await conn.execute(_IDLE, args.idle_threads)
            # no sweep during the load (the measure is what the turns write); each thread's turns are one session
            env = {"CLEANUP_INTERVAL": "100000", "MAX_SESSION_STEPS": "1000000"}
            async with servers(url, [["serve"]], env) as base, httpx.AsyncClient(base_url=base, timeout=60) as client:
                tools = [User(client, base, 1) for _ in range(args.clients)]
                plain = [User(client, base, 0) for _ in range(args.clients)]
                await asyncio.gather(*(u.open() for u in [*tools, *plain]))
                await runs(tools, args.clients)  # warm-up: every thread has had a turn
                await runs(plain, args.clients)
                await asyncio.sleep(1)
                start = await measure(conn)
                await conn.execute("SELECT pg_stat_reset()")
                began = time.perf_counter()
                await runs(tools, args.tool_turns)
                tool_seconds = time.perf_counter() - began
                await asyncio.sleep(1)
                stats_tool = {r["name"]: dict(r) for r in await conn.fetch(_STATS)}
                after_tools = await measure(conn)
                await runs(plain, args.plain_turns)
                await asyncio.sleep(1)
                after_plain = await measure(conn)
                await asyncio.gather(*(u.close() for u in [*tools, *plain]))
            gone = await sweep_everything(url)
            kept = await measure(conn)
            await conn.close()
    everything = args.tool_turns + args.plain_turns + 2 * args.clients  # with the warm-up's
    print(f"\ntool turns: {args.tool_turns / tool_seconds:.0f}/s over {tool_seconds:.1f} s")
    print("\nper turn: on disk after VACUUM (heap + indexes + TOAST; freed space stays allocated, for reuse), rows,")
    print("and the rows' own bytes (data); kept: the rows' bytes left after every retention sweep, per turn run\n")
    columns = ("disk/tool", 10), ("rows", 6), ("data/tool", 10), ("disk/plain", 10), ("rows", 6), ("data/plain", 10)
    print(f"{'table':<18} " + " ".join(f"{h:>{w}}" for h, w in columns) + f" {'kept':>8}")
    names = sorted(set(start) | set(kept), key=lambda n: -(after_plain.get(n, Table(0, 0)).bytes))
    totals = [0.0] * 5
    for name in names:
        tb, tr, td = per_turn(start, after_tools, args.tool_turns, name)
        pb, pr, pd = per_turn(after_tools, after_plain, args.plain_turns, name)
        kd = kept.get(name, Table(0, 0)).data / everything  # all that is left, the warm-up's turns' rows too
        if not any((tb, tr, td, pb, pr, pd, kd)):
            continue
        totals = [t + v for t, v in zip(totals, (tb, td, pb, pd, kd), strict=True)]
        print(f"{name:<18} {tb:10.0f} {tr:6.2f} {td:10.0f} {pb:10.0f} {pr:6.2f} {pd:10.0f} {kd:8.0f}")
    tb, td, pb, pd, kd = totals
    print(f"{'total':<18} {tb:10.0f} {'':>6} {td:10.0f} {pb:10.0f} {'':>6} {pd:10.0f} {kd:8.0f}")
    print(f"\nretention sweep deleted: {', '.join(f'{k} {v}' for k, v in gone.items())}")
    print(f"\nupdates during the {args.tool_turns} tool turns (statistics reset after the warm-up)\n")
    header = ("ins", 7), ("upd", 7), ("hot upd", 8), ("HOT %", 6), ("del", 7), ("dead left", 10), ("autovac", 8)
    print(f"{'table':<18} " + " ".join(f"{h:>{w}}" for h, w in header))
    for name, s in sorted(stats_tool.items(), key=lambda kv: -int(kv[1]["n_tup_upd"])):
        if not (s["n_tup_upd"] or s["n_tup_ins"] or s["n_tup_del"]):
            continue
        ratio = 100 * s["n_tup_hot_upd"] / s["n_tup_upd"] if s["n_tup_upd"] else 0.0
        print(
            f"{name:<18} {s['n_tup_ins']:7d} {s['n_tup_upd']:7d} {s['n_tup_hot_upd']:8d} {ratio:6.1f} "
            f"{s['n_tup_del']:7d} {s['n_dead_tup']:10d} {s['autovacuum_count']:8d}"
        )


if __name__ == "__main__":
    asyncio.run(main())
