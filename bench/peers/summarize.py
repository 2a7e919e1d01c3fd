#!/usr/bin/env python3
"""Summarize bench_client.py JSON lines into Markdown tables (medians over repetitions).

usage: python3 bench/peers/summarize.py bench/peers/results/<stamp>.jsonl [more.jsonl ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any


def med(xs: list[Any]) -> Any:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = statistics.median(xs)
    if isinstance(m, float):
        return round(m, 2) if abs(m) < 10 else round(m, 1)
    return m


def spread(xs: list[Any]) -> str:
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return ""
    return f" ({min(xs):g}–{max(xs):g})"


Row = dict[str, Any]
Key = tuple[str, str, str, str, Any]


def load(paths: list[str]) -> list[Row]:
    """The JSON lines of bench_client.py's result files."""
    rows: list[Row] = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def main() -> None:
    tables(load(sys.argv[1:]))


def tables(rows: list[Row]) -> None:
    """Print the B1, B2, B4 and B3 tables of these results."""
    groups: dict[Key, list[Row]] = defaultdict(list)
    for r in rows:
        clients = r.get("b2", {}).get("clients", "")
        groups[(r["label"], r["test"], r["path"], r["graph"], clients)].append(r)

    first = rows[0] if rows else {}
    servers: dict[str, str] = {}
    for r in rows:
        servers.setdefault(r["label"], f"{r.get('server')} {r.get('server_version') or ''}".strip())
    print(
        f"Servers: {'; '.join(f'{k} = {v}' for k, v in servers.items())}. Client python {first.get('python_client')}; "
        f"nproc {first.get('nproc')}; first result {first.get('time')}, last {rows[-1].get('time') if rows else '–'}\n"
    )

    print("### B1 dispatch latency (idle server, sequential runs, each on a fresh thread)\n")
    print("Medians over repetitions of each repetition's percentile; (min–max over repetitions) for p50.\n")
    print(
        "| mode | path | graph | reps | runs/rep | ack p50 ms | first output p50 ms | first output p99 ms "
        "| run done p50 ms | run done p99 ms | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (label, test, path, graph, _), rs in groups.items():
        if test != "b1":
            continue
        b = [r["b1"] for r in rs]
        fo50 = [x["first_output"]["p50_ms"] for x in b]
        print(
            f"| {label} | {path} | {graph} | {len(rs)} | {b[0]['done']['n'] + b[0]['errors']} "
            f"| {med([x['ack']['p50_ms'] for x in b])} "
            f"| {med(fo50)}{spread(fo50)} | {med([x['first_output']['p99_ms'] for x in b])} "
            f"| {med([x['done']['p50_ms'] for x in b])} | {med([x['done']['p99_ms'] for x in b])} "
            f"| {sum(x['errors'] for x in b)} |"
        )

    print("\n### B2 throughput (clients each on their own thread, runs back-to-back)\n")
    print(
        "| mode | graph | clients | reps | runs/s (min–max) | LLM steps/s | run p50 ms | run p99 ms "
        "| server CPU cores | server CPU ms / LLM step | server + Postgres (+ Redis) CPU ms / LLM step "
        "| server RSS max MB | Postgres CPU cores | Postgres PSS max MB "
        "| Redis CPU cores | client CPU cores | errors | unfinished at drain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (label, test, _path, graph, clients), rs in groups.items():
        if test != "b2" or graph == "stream":  # stream: the B4 table
            continue
        b = [r["b2"] for r in rs]
        res = [r["resources"] for r in rs]
        rps = [x["runs_per_s"] for x in b]
        redis_cpu = [x.get("redis", {}).get("cpu_cores") for x in res]
        # server CPU per LLM step: CPU cores over the sampled window / LLM steps per second of the window
        ms_step = [
            1000 * x["server"]["cpu_cores"] / y["llm_steps_per_s"]
            for x, y in zip(res, b, strict=True)
            if y["llm_steps_per_s"]
        ]
        # everything the server side burns per step: the client's share of the box is not the server's cost
        ms_all = [
            1000
            * (x["server"]["cpu_cores"] + x["postgres"]["cpu_cores"] + (x.get("redis", {}).get("cpu_cores") or 0))
            / y["llm_steps_per_s"]
            for x, y in zip(res, b, strict=True)
            if y["llm_steps_per_s"]
        ]
        print(
            f"| {label} | {graph} | {clients} | {len(rs)} | {med(rps)}{spread(rps)} "
            f"| {med([x['llm_steps_per_s'] for x in b])} "
            f"| {med([x['run_latency']['p50_ms'] for x in b])} | {med([x['run_latency']['p99_ms'] for x in b])} "
            f"| {med([x['server']['cpu_cores'] for x in res])} | {med(ms_step)} | {med(ms_all)} "
            f"| {med([x['server']['mem_mb_max'] for x in res])} "
            f"| {med([x['postgres']['cpu_cores'] for x in res])} | {med([x['postgres']['mem_mb_max'] for x in res])} "
            f"| {med(redis_cpu)} | {med([x['client']['cpu_cores'] for x in res])} "
            f"| {sum(x['errors'] for x in b)} | {sum(x.get('unfinished_at_drain', 0) for x in b)} |"
        )

    b4(groups)

    print("\n### B3 idle memory (10 s samples: after start, after the B1 warm-up, after B2)\n")
    print("| mode | sample | server RSS MB | Postgres PSS MB | Redis RSS MB | server CPU cores |")
    print("|---|---|---|---|---|---|")
    names = ["after start", "after B1", "after B2"]
    idle: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r["test"] == "idle":
            idle[r["label"]].append(r)
    for label, rs in idle.items():
        for i, r in enumerate(rs):
            res = r["resources"]
            print(
                f"| {label} | {names[i] if i < 3 else i} | {res['server']['mem_mb_median']} "
                f"| {res['postgres']['mem_mb_median']} | {res.get('redis', {}).get('mem_mb_median', '–')} "
                f"| {res['server']['cpu_cores']} |"
            )


def b4(groups: dict[Key, list[Row]]) -> None:
    """B4: B2 with --graph stream (a real OpenAI-compatible model over HTTP with latency, fake_llm.py)."""
    rows = [(k, rs) for k, rs in groups.items() if k[1] == "b2" and k[3] == "stream"]
    if not rows:
        return
    cfg: dict[str, Any] = next((r["b2"]["llm_config"] for _, rs in rows for r in rs if r["b2"].get("llm_config")), {})
    ideal = next((r["b2"].get("ideal_run_ms") for _, rs in rows for r in rs if r["b2"].get("ideal_run_ms")), None)
    print("\n### B4 streaming model (B2 with a real OpenAI-compatible model over HTTP: fake_llm.py)\n")
    print(
        f"Model: TTFT {cfg.get('ttft_ms')} ms, {cfg.get('chunks')} chunks every {cfg.get('interval_ms')} ms "
        f"({cfg.get('call_ms')} ms per answer); {cfg.get('tool_calls')} calls of `{cfg.get('tool_name')}` "
        f"(0.5 s each) per run. Ideal run = 2 answers + one tool time (calls run concurrently) = {ideal} ms; "
        "overhead = run latency - ideal. Chunk lag = client receive time - the time the model sent the chunk. "
        "CPU per LLM step excludes the fake model's own CPU (its own column) and the client's.\n"
    )
    print(
        "| mode | clients | reps | runs/s (min–max) | run p50 ms | run p99 ms | overhead p50 ms | overhead p99 ms "
        "| chunk lag p50 ms | chunk lag p99 ms | chunk lag max ms | chunks/run "
        "| server CPU cores | server + Postgres CPU ms / LLM step | server RSS max MB "
        "| fake LLM CPU cores | client CPU cores | LLM requests / run | errors | unfinished at drain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (label, _test, _path, _graph, clients), rs in rows:
        b = [r["b2"] for r in rs]
        res = [r["resources"] for r in rs]
        rps = [x["runs_per_s"] for x in b]
        lag = [x.get("chunk_lag") or {} for x in b]
        ms_all = [
            1000
            * (x["server"]["cpu_cores"] + x["postgres"]["cpu_cores"] + (x.get("redis", {}).get("cpu_cores") or 0))
            / y["llm_steps_per_s"]
            for x, y in zip(res, b, strict=True)
            if y["llm_steps_per_s"]
        ]
        chunks = [
            lg["n"] / y["completed_runs"] for lg, y in zip(lag, b, strict=True) if y["completed_runs"] and "n" in lg
        ]
        # model requests per finished run (the counters span the window and the drain)
        req = [
            y["llm_counts"]["requests"] / (y["completed_runs"] + y.get("completed_in_drain", 0))
            for y in b
            if y.get("llm_counts") and y["completed_runs"]
        ]
        print(
            f"| {label} | {clients} | {len(rs)} | {med(rps)}{spread(rps)} "
            f"| {med([x['run_latency']['p50_ms'] for x in b])} | {med([x['run_latency']['p99_ms'] for x in b])} "
            f"| {med([x.get('overhead_p50_ms') for x in b])} | {med([x.get('overhead_p99_ms') for x in b])} "
            f"| {med([x.get('p50_ms') for x in lag])} | {med([x.get('p99_ms') for x in lag])} "
            f"| {med([x.get('max_ms') for x in lag])} | {med(chunks)} "
            f"| {med([x['server']['cpu_cores'] for x in res])} | {med(ms_all)} "
            f"| {med([x['server']['mem_mb_max'] for x in res])} "
            f"| {med([x.get('fake_llm', {}).get('cpu_cores') for x in res])} "
            f"| {med([x['client']['cpu_cores'] for x in res])} | {med(req)} "
            f"| {sum(x['errors'] for x in b)} | {sum(x.get('unfinished_at_drain', 0) for x in b)} |"
        )


if __name__ == "__main__":
    main()
