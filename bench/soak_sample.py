"""What the soak (bench/soak.py) samples every minute, and its verdict on the samples.

A sample: the RSS of each process, every table's size (heap + TOAST) and its indexes' size, live and dead tuples,
autovacuum runs and updates (HOT among them), the database's connections by state, the queue (threads waiting to be
claimed, leases held, effects due) and the turns that ended since the sample before (first output, turn time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.harness import percentile

TABLES = """
SELECT relname AS name, n_live_tup AS live, n_dead_tup AS dead, autovacuum_count AS autovacuums,
       vacuum_count AS vacuums, n_tup_upd AS updates, n_tup_hot_upd AS hot_updates,
       pg_table_size(relid) AS table_bytes, pg_indexes_size(relid) AS index_bytes
FROM pg_stat_user_tables
"""
INDEXES = "SELECT indexrelname AS name, relname AS tab, pg_relation_size(indexrelid) AS bytes FROM pg_stat_user_indexes"
CONNECTIONS = (
    "SELECT coalesce(state, 'other') AS state, count(*) AS n FROM pg_stat_activity"
    " WHERE datname = current_database() GROUP BY 1"
)
QUEUE = """
SELECT (SELECT count(*) FROM threads WHERE runnable_since IS NOT NULL AND lease_token IS NULL) AS waiting,
       (SELECT count(*) FROM leases) AS leased,
       (SELECT count(*) FROM effects WHERE status = 'scheduled' AND run_at <= now()) AS effects_due,
       pg_database_size(current_database()) AS db_bytes
"""


@dataclass
class Turn:
    """One user message's turn as its client saw it: seconds from the POST to the first output and to idle."""

    ended: float  # time.monotonic()
    first_output: float
    turn: float
    asked: str = "go"  # the user message (what the turn calls)


@dataclass
class Sample:
    minute: float
    rss_mb: dict[str, float]
    tables: dict[str, dict[str, int]]
    indexes: dict[str, int]
    connections: dict[str, int]
    queue: dict[str, int]
    turns: list[Turn] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The sample as one JSON line (`--out`)."""
        first = [t.first_output for t in self.turns]
        whole = [t.turn for t in self.turns]
        return {
            "minute": round(self.minute, 2),
            "rss_mb": self.rss_mb,
            "tables": self.tables,
            "connections": self.connections,
            "queue": self.queue,
            "turns": len(self.turns),
            "first_output_ms": ms(first),
            "turn_ms": ms(whole),
        }


def ms(values: list[float]) -> dict[str, float | None]:
    """p50 / p99 in milliseconds (None without values)."""
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": round(percentile(values, 50) * 1000, 1), "p99": round(percentile(values, 99) * 1000, 1)}


def rss_mb(pid: int | None) -> float:
    """A process's resident memory now (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def take(conn: asyncpg.Connection, started: float, pids: dict[str, int | None], turns: list[Turn]) -> Sample:
    """One sample of the database and the processes; `turns` are those that ended since the last one."""
    tables = {r["name"]: {k: int(v) for k, v in r.items() if k != "name"} for r in await conn.fetch(TABLES)}
    indexes = {f"{r['tab']}.{r['name']}": int(r["bytes"]) for r in await conn.fetch(INDEXES)}
    connections = {r["state"]: int(r["n"]) for r in await conn.fetch(CONNECTIONS)}
    queue = {k: int(v) for k, v in (await conn.fetchrow(QUEUE) or {}).items()}
    rss = {name: rss_mb(pid) for name, pid in pids.items()}
    return Sample((time.monotonic() - started) / 60, rss, tables, indexes, connections, queue, turns)


def dead_bound(table: dict[str, int]) -> float:
    """Twice autovacuum's default trigger for a table (50 + 20 % of its live rows): dead tuples above it mean
    vacuum is not keeping up."""
    return 2 * (50 + 0.2 * table["live"])


@dataclass
class Verdict:
    what: str
    figure: str
    ok: bool


def verdicts(samples: list[Sample], window: int, judged: list[str]) -> list[Verdict]:
    """The issue's figures over the samples: `window` samples are the warm-up and each end's latency window;
    `judged` names the processes that live the whole run (their RSS is compared)."""
    out: list[Verdict] = []
    if len(samples) < 2 * window:
        return [Verdict("enough samples", f"{len(samples)} < 2 x {window}", False)]
    warm, last = samples[window - 1], samples[-1]
    for name in judged:
        peak = max(s.rss_mb[name] for s in samples[window - 1 :])
        base = warm.rss_mb[name]
        out.append(
            Verdict(
                f"RSS of `{name}` after warm-up within +10 %",
                f"{base:.0f} MB at minute {warm.minute:.0f}, at most {peak:.0f} MB after ({peak / base - 1:+.1%})",
                base > 0 and peak <= 1.10 * base,
            )
        )
    head = [t for s in samples[:window] for t in s.turns]
    tail = [t for s in samples[-window:] for t in s.turns]
    for label, field_ in (("first output", "first_output"), ("turn time", "turn")):
        for p in (50, 99):
            if not head or not tail:
                out.append(Verdict(f"{label} p{p}, last window within 20 % of the first", "no turns", False))
                continue
            a = percentile([getattr(t, field_) for t in head], p)
            b = percentile([getattr(t, field_) for t in tail], p)
            out.append(
                Verdict(
                    f"{label} p{p}, last window within 20 % of the first",
                    f"{a * 1000:.0f} → {b * 1000:.0f} ms ({b / a - 1:+.1%})",
                    b <= 1.2 * a,
                )
            )
    # bounded: a table's dead tuples, averaged over the last window, stay under twice autovacuum's trigger, or at
    # least do not grow past half again their average in the window after the warm-up. A hot table's dead tuples are
    # a sawtooth (a small table updated every step collects more dead versions between two autovacuum runs, a minute
    # apart, than its trigger): one sample is wherever the tooth happened to be, the window's mean is its level. Flat
    # is bounded, growth is not.
    early = samples[window - 1 : 2 * window - 1]
    rows: list[tuple[float, str, float, float, float]] = []
    for n in last.tables:
        before = [s.tables[n]["dead"] for s in early if n in s.tables]
        after = [s.tables[n] for s in samples[-window:] if n in s.tables]  # `last` among them
        level = sum(before) / len(before) if before else 0.0
        now = sum(t["dead"] for t in after) / len(after)
        bound = max(sum(dead_bound(t) for t in after) / len(after), 1.5 * level)
        rows.append((now / bound, n, level, now, bound))
    ratio, name, level, now, bound = max(rows, key=lambda x: x[0])
    out.append(
        Verdict(
            "dead tuples bounded (their mean over the last window ≤ 2 x autovacuum's trigger, 50 + 20 % of live "
            "rows, on average over the window, or ≤ 1.5 x their mean in the window after the warm-up)",
            f"worst `{name}`: {now:.0f} dead on average ({last.tables[name]['live']} live at the end) against "
            f"{level:.0f} after the warm-up, bound {bound:.0f} ({ratio:.2f} of it)",
            ratio <= 1,
        )
    )
    turns = sum(len(s.turns) for s in samples)
    grown = last.queue["db_bytes"] - samples[0].queue["db_bytes"]
    if turns:
        out.append(Verdict("database growth per turn (stated, not judged)", f"{grown / turns / 1024:.1f} KB", True))
    return out


def minute_table(samples: list[Sample], workers: list[str]) -> list[str]:
    """The per-minute Markdown table."""
    head = (
        "| minute | turns | first output p50 / p99 ms | turn p50 / p99 ms | RSS api"
        + "".join(f" / {w}" for w in workers)
        + " MB | database MB | dead tuples (worst table) | autovacuum runs | connections "
        "| waiting / leased / effects due |"
    )
    lines = [head, "|" + " --- |" * 10]
    for s in samples:
        first, whole = s.row()["first_output_ms"], s.row()["turn_ms"]
        worst = max(s.tables, key=lambda n: s.tables[n]["dead"])
        dead = sum(t["dead"] for t in s.tables.values())
        vacuums = sum(t["autovacuums"] for t in s.tables.values())
        rss = " / ".join(f"{s.rss_mb[k]:.0f}" for k in ["api", *workers])
        lines.append(
            f"| {s.minute:.1f} | {len(s.turns)} | {first['p50']} / {first['p99']} | {whole['p50']} / {whole['p99']} "
            f"| {rss} | {s.queue['db_bytes'] / 2**20:.1f} | {dead} ({worst} {s.tables[worst]['dead']}) | {vacuums} "
            f"| {sum(s.connections.values())} | {s.queue['waiting']} / {s.queue['leased']} / {s.queue['effects_due']} |"
        )
    return lines


def table_table(first: Sample, last: Sample) -> list[str]:
    """Per table, first and last sample: size, index size, live and dead rows, autovacuum runs, HOT updates."""
    lines = [
        "| table | size MB | indexes MB | live rows | dead rows | autovacuum runs | updates (HOT) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in sorted(last.tables, key=lambda n: -last.tables[n]["table_bytes"] - last.tables[n]["index_bytes"]):
        a, b = first.tables.get(name, {}), last.tables[name]
        hot = f"{b['hot_updates'] / b['updates']:.0%}" if b["updates"] else "–"
        lines.append(
            f"| {name} | {_mb(a, 'table_bytes')} → {_mb(b, 'table_bytes')} | {_mb(a, 'index_bytes')} → "
            f"{_mb(b, 'index_bytes')} | {a.get('live', 0)} → {b['live']} | {a.get('dead', 0)} → {b['dead']} "
            f"| {b['autovacuums']} | {b['updates']} ({hot}) |"
        )
    return lines


def _mb(table: dict[str, int], key: str) -> str:
    return f"{table.get(key, 0) / 2**20:.2f}"


def kinds_table(samples: list[Sample]) -> list[str]:
    """Per kind of turn (what the user message asked for), over the whole run: count, first output, turn time."""
    kinds: dict[str, list[Turn]] = {}
    for s in samples:
        for t in s.turns:
            kinds.setdefault(t.asked, []).append(t)
    lines = ["| asked | turns | first output p50 ms | turn p50 / p99 ms |", "| --- | --- | --- | --- |"]
    for asked, turns in sorted(kinds.items()):
        first, whole = ms([t.first_output for t in turns]), ms([t.turn for t in turns])
        lines.append(f"| `{asked}` | {len(turns)} | {first['p50']} | {whole['p50']} / {whole['p99']} |")
    return lines
