"""Side-by-side benchmark client for agent-thread servers (Aegra and ours), run by bench/peers/run.sh.

    python -m bench.peers.bench_client b2 --target standard-agents --graph tool --clients 50 --base-url ...

One scenario, several servers: a thread receives one user message, the server runs one
agent turn against a deterministic zero-latency fake model ("chat": one LLM step; "tool":
LLM step -> one tool call -> LLM step), and streams the result over SSE.

Tests
  b1   dispatch latency on an idle server: --runs sequential runs, each on a fresh thread.
       Per run: t_ack (the server accepted the run), t_out (first streamed event that
       carries model output), t_done (run finished). Times from the start of the request
       that starts the run (the thread, and for subscribe-first paths the SSE stream,
       already exist before the clock starts).
  b2   throughput: --clients concurrent clients, each on its own thread, start runs
       back-to-back for --duration seconds; completed runs/s and LLM steps/s.
  b4   = b2 with --graph stream: the servers call a real OpenAI-compatible model over HTTP (fake_llm.py, with
       latency, streamed; --llm-url); also the delivery lag of every streamed text chunk (each carries the time
       the model sent it, `⟨ts⟩`) and the run latency over the "ideal" (model time x 2 + one tool time).
  idle sample server memory/CPU only.
Every test samples RSS / CPU of the processes given by --pid (repeatable) / --pg-data / --redis-pid (B3).

Bounded: b1 stops after --runs runs; b2 stops at --duration seconds (plus a drain of at
most --drain seconds) and after --max-runs runs per client. Only the --base-url host
(127.0.0.1 by default) is contacted; a non-loopback URL is refused.

Output: one JSON object (printed, and appended to --out if given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import platform
import random
import statistics
import time
import urllib.parse
from typing import Any

import httpx

from bench.peers.adapters import ADAPTERS, Adapter
from bench.peers.resources import Sampler, read_text

STEPS_PER_RUN = {"chat": 1, "tool": 2, "stream": 2}


# --------------------------------------------------------------------------- tests


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def ms_summary(xs: list[float]) -> dict[str, float | None]:
    """n and p50/p90/p99/max/mean in ms of durations in seconds (None where there are none)."""
    r = _ms
    return {
        "n": len(xs),
        "p50_ms": r(pct(xs, 50)),
        "p90_ms": r(pct(xs, 90)),
        "p99_ms": r(pct(xs, 99)),
        "max_ms": r(max(xs) if xs else None),
        "mean_ms": r(statistics.fmean(xs) if xs else None),
    }


async def run_b1(adapter: Adapter, runs: int, warmup: int, jitter: float) -> dict[str, Any]:
    acks, outs, dones, errors, lags = [], [], [], [], []
    for i in range(warmup + runs):
        tid = await adapter.create_thread()
        sess = await adapter.open_session(tid)
        # Idle server: let the thread/subscription settle; the random part spreads the start
        # over any server-side poll period (Aegra v2 polls for new runs every 250 ms).
        await asyncio.sleep(0.01 + random.random() * jitter)
        t0 = time.perf_counter()
        t = await adapter.run(tid, sess, t0)
        await adapter.close_session(sess)
        if i < warmup:
            continue
        if not t.ok:
            errors.append(t.error)
            continue
        if t.t_ack is not None:
            acks.append(t.t_ack)
        if t.t_out is not None:
            outs.append(t.t_out)
        if t.t_done is not None:
            dones.append(t.t_done)
        lags.extend(t.lags)
    out = {
        "ack": ms_summary(acks),
        "first_output": ms_summary(outs),
        "done": ms_summary(dones),
        "errors": len(errors),
        "error_samples": errors[:3],
    }
    if adapter.track_lag:
        out["chunk_lag"] = ms_summary(lags)
    return out


def user_client(base_url: str, connections: int) -> httpx.AsyncClient:
    # keepalive_expiry below uvicorn's 5 s keep-alive timeout: with httpx's default (also 5 s) a pooled
    # connection can be reused just as the server closes it, which shows up as a ReadError.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0)
    return httpx.AsyncClient(base_url=base_url, limits=limits, timeout=httpx.Timeout(60.0, connect=10.0))


async def run_b2(
    adapter: Adapter, clients: int, duration: float, max_runs: int, drain: float, steps_per_run: int
) -> dict[str, Any]:
    # Each simulated user has its own HTTP client (one stream + one request connection), as separate
    # browsers would. One shared pool of ~2 x clients connections made httpcore walk every pooled
    # connection on each request and response: O(clients) client CPU per request, which at 200
    # clients made the client, not the server, the bottleneck.
    http = [user_client(str(adapter.c.base_url), 3) for _ in range(clients)]
    users = [adapter.with_client(c) for c in http]
    try:
        return await _b2(users, duration, max_runs, drain, steps_per_run)
    finally:
        await asyncio.gather(*(c.aclose() for c in http), return_exceptions=True)


async def _b2(users: list[Adapter], duration: float, max_runs: int, drain: float, steps_per_run: int) -> dict[str, Any]:
    clients = len(users)
    tids = await asyncio.gather(*(u.create_thread() for u in users))
    sessions = await asyncio.gather(*(u.open_session(t) for u, t in zip(users, tids, strict=False)))
    lat: list[float] = []
    lags: list[float] = []
    errors: list[str] = []
    completed_in_window = 0
    completed_after = 0  # finished during the drain (not counted in runs/s)
    start = time.perf_counter()
    stop_at = start + duration

    async def worker(adapter: Adapter, tid: str, sess: Any) -> None:
        nonlocal completed_in_window, completed_after
        n = 0
        while n < max_runs and time.perf_counter() < stop_at:
            n += 1
            t0 = time.perf_counter()
            try:
                t = await adapter.run(tid, sess, t0)
            except (TimeoutError, httpx.HTTPError) as e:
                errors.append(f"{type(e).__name__}: {e}"[:200])
                await asyncio.sleep(0.05)
                continue
            if t.ok:
                if time.perf_counter() <= stop_at:
                    completed_in_window += 1
                    lat.append(t.t_done or 0.0)
                    lags.extend(t.lags)
                else:
                    completed_after += 1
            else:
                errors.append(t.error or "?")

    tasks = [asyncio.create_task(worker(u, t, s)) for u, t, s in zip(users, tids, sessions, strict=False)]
    _done, pending = await asyncio.wait(tasks, timeout=duration + drain)
    for p in pending:
        p.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await asyncio.gather(*(u.close_session(s) for u, s in zip(users, sessions, strict=False)))
    runs_s = completed_in_window / duration
    out = {
        "clients": clients,
        "duration_s": duration,
        "completed_runs": completed_in_window,
        "completed_in_drain": completed_after,
        "runs_per_s": round(runs_s, 2),
        "llm_steps_per_s": round(runs_s * steps_per_run, 2),
        "run_latency": ms_summary(lat),
        "errors": len(errors),
        "error_samples": errors[:3],
        "unfinished_at_drain": len(pending),
    }
    if users and users[0].track_lag:
        out["chunk_lag"] = ms_summary(lags)
    return out


# --------------------------------------------------------------------------- main


def _check_loopback(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return
    with contextlib.suppress(ValueError):  # a name, not an address
        if ipaddress.ip_address(host).is_loopback:
            return
    raise SystemExit(f"refusing non-loopback target {host!r}")


def _pg_postmaster(pgdata: str | None) -> int:
    if not pgdata:
        return 0
    first = read_text(os.path.join(pgdata, "postmaster.pid")).split("\n", 1)[0].strip()
    return int(first) if first.isdigit() else 0


async def _llm_get(url: str | None, what: str) -> dict[str, Any]:
    """fake_llm.py's /config or /stats ({} without --llm-url)."""
    if not url:
        return {}
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as c:
        r = await c.get(f"/{what}")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


def _stream_figures(
    res: dict[str, Any], config: dict[str, Any], before: dict[str, Any], after: dict[str, Any], tool_s: float
) -> dict[str, Any]:
    """B4: the ideal run time (two model answers + one tool time: the 3 calls concurrently) and the model's counters."""
    out: dict[str, Any] = {"llm_config": config, "tool_s": tool_s}
    if config:
        ideal = 2 * config["call_ms"] + tool_s * 1000
        out["ideal_run_ms"] = round(ideal, 1)
        lat = res.get("run_latency") or res.get("done") or {}
        for p in ("p50", "p99"):
            if lat.get(f"{p}_ms") is not None:
                out[f"overhead_{p}_ms"] = round(lat[f"{p}_ms"] - ideal, 1)
    if after:
        keys = (
            "requests",
            "streamed",
            "tool_answers",
            "text_answers",
            "tool_calls_sent",
            "parallel_false",
            "errors",
            "disconnects",
        )
        out["llm_counts"] = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
        out["llm_counts"]["max_in_flight_ever"] = after.get("max_in_flight")
    return out


async def amain(a: argparse.Namespace) -> dict[str, Any]:
    _check_loopback(a.base_url)
    if a.llm_url:
        _check_loopback(a.llm_url)
    # keepalive_expiry below uvicorn's 5 s keep-alive timeout: with httpx's default (also 5 s) a pooled
    # connection can be reused just as the server closes it, which shows up as a ReadError.
    limits = httpx.Limits(
        max_connections=a.clients * 2 + 20, max_keepalive_connections=a.clients * 2 + 20, keepalive_expiry=2.0
    )
    timeout = httpx.Timeout(60.0, connect=10.0)
    async with httpx.AsyncClient(base_url=a.base_url, limits=limits, timeout=timeout) as client:
        adapter = ADAPTERS[a.target](client, a.graph, a.path)
        meta = await adapter.setup()
        sampler = Sampler(
            {
                "server": (a.pid or 0, "VmRSS"),  # a list: --pid may be given more than once
                "postgres": (_pg_postmaster(a.pg_data), "Pss"),
                "redis": (a.redis_pid or 0, "VmRSS"),
                "client": (os.getpid(), "VmRSS"),
                "fake_llm": (a.llm_pid or 0, "VmRSS"),  # B4's model server: not the server's cost
            }
        )
        result: dict[str, Any] = {
            "test": a.test,
            "label": a.label,
            "target": a.target,
            "path": a.path,
            "graph": a.graph,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "nproc": os.cpu_count(),
            "python_client": platform.python_version(),
            "server_pids": a.pid or [],
            **meta,
        }
        if a.test == "b2" and a.warmup:
            await run_b2(adapter, min(a.clients, 20), 3.0, a.max_runs, a.drain, STEPS_PER_RUN[a.graph])
        llm_config = await _llm_get(a.llm_url, "config") if a.graph == "stream" else {}
        llm_before = await _llm_get(a.llm_url, "stats") if a.graph == "stream" else {}
        sampler.start()
        if a.test == "b1":
            result["b1"] = await run_b1(adapter, a.runs, a.warmup, a.jitter)
        elif a.test == "b2":
            result["b2"] = await run_b2(adapter, a.clients, a.duration, a.max_runs, a.drain, STEPS_PER_RUN[a.graph])
        elif a.test == "idle":
            await asyncio.sleep(a.duration)
        result["resources"] = await sampler.stop()
        if a.graph == "stream" and a.test in ("b1", "b2"):
            after = await _llm_get(a.llm_url, "stats")
            result[a.test].update(_stream_figures(result[a.test], llm_config, llm_before, after, a.tool_s))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("test", choices=["b1", "b2", "idle"])
    p.add_argument("--base-url", default="http://127.0.0.1:2026")
    p.add_argument("--target", choices=sorted(ADAPTERS), default="aegra")
    p.add_argument("--path", default="stream", help="aegra: stream | v2 | join | wait")
    p.add_argument("--graph", choices=sorted(STEPS_PER_RUN), default="chat", help="graph (Aegra) or agent name")
    p.add_argument("--runs", type=int, default=200, help="b1: measured runs")
    p.add_argument("--warmup", type=int, default=10, help="b1: unmeasured runs first; b2: 3 s warm-up if > 0")
    p.add_argument("--jitter", type=float, default=0.25, help="b1: random extra idle time (s) before each run")
    p.add_argument("--clients", type=int, default=50, help="b2: concurrent clients (threads)")
    p.add_argument("--duration", type=float, default=30.0, help="b2/idle: seconds")
    p.add_argument("--max-runs", type=int, default=100_000, help="b2: cap on runs per client")
    p.add_argument("--drain", type=float, default=30.0, help="b2: max seconds to wait for in-flight runs")
    p.add_argument(
        "--pid",
        type=int,
        action="append",
        help="server process id (its children are included); repeat it for a server made of several processes",
    )
    p.add_argument("--pg-data", help="Postgres data dir (postmaster.pid gives the process tree)")
    p.add_argument("--redis-pid", type=int)
    p.add_argument("--llm-url", help="stream: fake_llm.py's origin (http://127.0.0.1:PORT), for /config and /stats")
    p.add_argument("--llm-pid", type=int, help="stream: fake_llm.py's process (its CPU, sampled apart)")
    p.add_argument("--tool-s", type=float, default=0.5, help="stream: the tool's sleep (graph.py, lookup_slow.py)")
    p.add_argument("--label", default="")
    p.add_argument("--out", help="append the JSON result to this file")
    a = p.parse_args()
    res = asyncio.run(amain(a))
    line = json.dumps(res)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
