#!/usr/bin/env python3
"""Side-by-side tables (ours vs Aegra) from one run of bench/peers/run.sh: medians over repetitions.

usage: python3 bench/peers/compare.py bench/peers/results/<stamp>.jsonl [OURS:AEGRA ...]
       (pairs default: sa:local sa2:redis)

Prints Markdown: B1 latency (and server CPU per B1 run), B2 throughput, memory/CPU, and the ratios ours/Aegra for
each pair.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any


def med(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:.0f}"


Row = dict[str, Any]


def main() -> None:
    with open(sys.argv[1]) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    pairs = [(a, b) for a, _, b in (p.partition(":") for p in sys.argv[2:])] or [("sa", "local"), ("sa2", "redis")]
    tables(rows, pairs)


def tables(rows: list[Row], pairs: list[tuple[str, str]]) -> None:
    """Print ours and Aegra's figures side by side, and the ratios ours / Aegra for each (ours, Aegra) pair."""
    modes: list[str] = []
    for r in rows:
        if r["label"] not in modes and "+" not in r["label"]:
            modes.append(r["label"])
    b1: dict[tuple[str, str], list[Row]] = defaultdict(list)
    b2: dict[tuple[str, str, int], list[Row]] = defaultdict(list)
    idle: dict[str, list[Row]] = defaultdict(list)
    allres: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        allres[r["label"]].append(r["resources"])
        if r["test"] == "b1" and r["path"] in ("stream", "events"):
            # server CPU per run: sequential runs on an idle server (the 10 warm-up runs included, and each run's
            # thread creation and stream open/close)
            runs = r["b1"]["done"]["n"] + r["b1"]["errors"] + 10
            b1[(r["label"], r["graph"])].append(
                {**r["b1"], "cpu_ms_per_run": 1000 * r["resources"]["server"]["cpu_s"] / runs}
            )
        elif r["test"] == "b2":
            b2[(r["label"], r["graph"], r["b2"]["clients"])].append(r)
        elif r["test"] == "idle":
            idle[r["label"]].append(r["resources"])
    graphs = sorted({g for _, g in b1} | {g for _, g, _ in b2})
    clients = sorted({c for _, _, c in b2})

    def lat(mode: str, graph: str, what: str, p: str) -> float | None:
        return med([x[what][p] for x in b1.get((mode, graph), [])])

    print("### B1 latency on an idle server (ms; median over repetitions of each repetition's percentile)\n")
    print(
        "| mode | graph | reps × runs | ack p50 | first output p50 | first output p99 | done p50 | done p99 | errors "
        "| server CPU ms per run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        for g in graphs:
            xs = b1.get((m, g), [])
            if not xs:
                continue
            print(
                f"| {m} | {g} | {len(xs)} × {xs[0]['done']['n'] + xs[0]['errors']} | {f(lat(m, g, 'ack', 'p50_ms'))} "
                f"| {f(lat(m, g, 'first_output', 'p50_ms'))} | {f(lat(m, g, 'first_output', 'p99_ms'))} "
                f"| {f(lat(m, g, 'done', 'p50_ms'))} | {f(lat(m, g, 'done', 'p99_ms'))} "
                f"| {sum(x['errors'] for x in xs)} "
                f"| {f(med([x['cpu_ms_per_run'] for x in xs]))} |"
            )

    def tput(mode: str, graph: str, n: int, key: str = "runs_per_s") -> float | None:
        return med([r["b2"][key] for r in b2.get((mode, graph, n), [])])

    print("\n### B2 throughput (clients on their own threads, runs back-to-back; medians over repetitions)\n")
    print(
        "| mode | graph | clients | reps | runs/s (each rep) | LLM steps/s | run p50 ms | run p99 ms | errors "
        "| unfinished at drain | server CPU cores | server CPU ms / LLM step | Postgres CPU cores | client CPU cores |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in modes + sorted({k[0] for k in b2} - set(modes)):
        for g in graphs:
            for n in clients:
                rs = b2.get((m, g, n), [])
                if not rs:
                    continue
                each = ", ".join(f"{r['b2']['runs_per_s']:g}" for r in rs)
                cpu = [r["resources"]["server"]["cpu_cores"] for r in rs]
                ms_step = [
                    1000 * r["resources"]["server"]["cpu_cores"] / r["b2"]["llm_steps_per_s"]
                    for r in rs
                    if r["b2"]["llm_steps_per_s"]
                ]
                print(
                    f"| {m} | {g} | {n} | {len(rs)} | {f(tput(m, g, n))} ({each}) "
                    f"| {f(tput(m, g, n, 'llm_steps_per_s'))} "
                    f"| {f(med([r['b2']['run_latency']['p50_ms'] for r in rs]), 0)} "
                    f"| {f(med([r['b2']['run_latency']['p99_ms'] for r in rs]), 0)} "
                    f"| {sum(r['b2']['errors'] for r in rs)} "
                    f"| {sum(r['b2'].get('unfinished_at_drain', 0) for r in rs)} "
                    f"| {f(med(cpu), 2)} | {f(med(ms_step))} "
                    f"| {f(med([r['resources']['postgres']['cpu_cores'] for r in rs]), 2)} "
                    f"| {f(med([r['resources']['client']['cpu_cores'] for r in rs]), 2)} |"
                )

    print("\n### Memory (MB) and CPU\n")
    print(
        "Server = every process of the server (RSS); Postgres = PSS of all its processes. Idle = median of a 10 s "
        "sample; max = the largest sample of any test of the mode; B2 CPU = median server CPU cores over all B2 "
        "repetitions of the mode.\n"
    )
    print(
        "| mode | server RSS idle after start | idle after B1 | idle after B2 | server RSS max | Postgres PSS max "
        "| server CPU cores in B2 (min–max) | server + Postgres CPU cores in B2 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m in modes:
        ids = [x["server"]["mem_mb_median"] for x in idle.get(m, [])] + [None] * 3
        cpus = [r["resources"]["server"]["cpu_cores"] for k, rs in b2.items() if k[0] == m for r in rs]
        both = [
            r["resources"]["server"]["cpu_cores"] + r["resources"]["postgres"]["cpu_cores"]
            for k, rs in b2.items()
            if k[0] == m
            for r in rs
        ]
        print(
            f"| {m} | {f(ids[0])} | {f(ids[1])} | {f(ids[2])} "
            f"| {f(max(x['server']['mem_mb_max'] for x in allres[m]))} "
            f"| {f(max(x['postgres']['mem_mb_max'] for x in allres[m]))} "
            f"| {f(med(cpus), 2)} ({f(min(cpus), 2)}–{f(max(cpus), 2)}) | {f(med(both), 2)} |"
            if cpus
            else f"| {m} | – |"
        )

    print("\n### Ratios ours / Aegra\n")
    print("Throughput: > 1 means ours completes more. Latency: < 1 means ours is faster.\n")
    head = "| figure | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |"
    print(head)
    print("|---|" + "---|" * len(pairs))

    def ratio(x: float | None, y: float | None) -> str:
        return "–" if x is None or y is None or y == 0 else f"{x / y:.2f}"

    for g in graphs:
        for n in clients:
            print(
                f"| B2 {g} {n} clients, runs/s | "
                + " | ".join(
                    f"{ratio(tput(a, g, n), tput(b, g, n))} ({f(tput(a, g, n))} vs {f(tput(b, g, n))})"
                    for a, b in pairs
                )
                + " |"
            )
    for g in graphs:
        for what, label in (("first_output", "first output"), ("done", "done")):
            for p in ("p50_ms", "p99_ms"):
                print(
                    f"| B1 {g} {label} {p[:3]} | "
                    + " | ".join(
                        f"{ratio(lat(a, g, what, p), lat(b, g, what, p))} "
                        f"({f(lat(a, g, what, p))} vs {f(lat(b, g, what, p))} ms)"
                        for a, b in pairs
                    )
                    + " |"
                )


if __name__ == "__main__":
    main()
