"""P4 — SSE fan-out: 1,000 subscribers on one API process; commit → client latency, lost and duplicated events.

An `agents api` process serves the streams. The benchmark follows `--threads` threads with `--subscribers` streams
(spread evenly), then writes events into those threads from its own process, the way a worker does
(`app.events.append` in a transaction of its own, NOTIFY at commit): `--rate` events per second per thread for
`--seconds`. The latency of an event is the moment its last line is read by a subscriber minus the moment its commit
returned to the writer; afterwards every subscriber's list of seqs is compared with the stored log: a missing seq is a
lost event, a repeated one a duplicate.

    .venv/bin/python -m bench.p4_fanout [--subscribers 1000] [--threads 1] [--rate 20] [--seconds 10] [--runs 3]

Target (`design/targets.md`): commit → client p99 ≤ 100 ms; zero lost or duplicated events.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import sys
import time
import uuid
from collections import Counter

import httpx

from app import db, event_types, events
from bench.harness import ROOT, Stream, database, median, percentile, postgres_server, postgres_version, servers, setup

PAYLOAD: event_types.Custom = {"event_type": "bench", "data": {"text": "x" * 200}}  # about the size of a step's events


async def run_once(server_url: str, args: argparse.Namespace) -> dict[str, float]:
    async with database(server_url) as url, servers(url, [["api"]]) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            threads = [
                (await client.post("/threads", json={"agent": "bench"})).json()["id"] for _ in range(args.threads)
            ]
        streams = [Stream(base, f"/threads/{threads[i % args.threads]}/events") for i in range(args.subscribers)]
        tasks = [asyncio.create_task(s.run()) for s in streams]
        connect_start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in streams)), 120)
        connect_s = time.perf_counter() - connect_start
        await asyncio.sleep(1)  # every stream past its backlog read and waiting on live events
        gc.disable()  # the readers keep every event: collector pauses would show up as latency
        committed = await _writer(url, threads, args.rate, args.seconds)
        await asyncio.sleep(3)  # the last events on their way to every subscriber
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        gc.enable()
    latencies: list[float] = []
    lost = duplicated = cut_off = 0
    for i, stream in enumerate(streams):
        log = committed[uuid.UUID(threads[i % args.threads])]
        counts = Counter(e.seq for e in stream.events if e.seq is not None)
        duplicated += sum(n - 1 for n in counts.values() if n > 1)
        lost += sum(1 for seq in log if seq not in counts)
        cut_off += stream.closed_by_server
        latencies += [(e.at - log[e.seq]) * 1000 for e in stream.events if e.seq in log]
    return {
        "connect_s": connect_s,
        "events": len(latencies),
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "max": max(latencies),
        "lost": lost,
        "duplicated": duplicated,
        "cut_off": cut_off,
    }


async def _writer(url: str, threads: list[str], rate: float, seconds: float) -> dict[uuid.UUID, dict[int, float]]:
    """Run the writer in a process of its own (so the readers' work cannot delay its clock); its commit times."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.p4_fanout",
        "--write",
        url,
        str(rate),
        str(seconds),
        *threads,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the writer failed ({proc.returncode})")
    return {uuid.UUID(t): {int(seq): at for seq, at in times.items()} for t, times in json.loads(out).items()}


async def write(url: str, threads: list[uuid.UUID], rate: float, seconds: float) -> None:
    """Append events at `rate` per second per thread, one transaction each; print each seq's commit-return time."""
    engine = db.create_engine(url, 2)
    sessions = db.sessionmaker(engine)
    committed: dict[str, dict[int, float]] = {str(t): {} for t in threads}
    start = time.monotonic()
    try:
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
            for thread in threads:
                async with sessions() as session:
                    seq = await events.append(session, thread, "event", PAYLOAD)
                    await session.commit()
                assert seq is not None  # not held: stored at once
                committed[str(thread)][seq] = time.time()
    finally:
        await engine.dispose()
    print(json.dumps(committed))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rate", type=float, default=20, help="events per second per thread")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.subscribers + 256)), hard))
    with postgres_server() as server_url:
        settings = {
            "runs": args.runs,
            "streams": f"{args.subscribers} subscribers on {args.threads} thread(s), one `agents api` process",
            "load": f"{args.rate:g} events/s per thread for {args.seconds:g} s, one transaction each, another process",
            "client": "one asyncio process, bare-socket SSE readers (HTTP/1.0)",
        }
        setup("P4 SSE fan-out: commit → client", settings, await postgres_version(server_url))
        print("\n| run | events delivered | p50 ms | p99 ms | max ms | lost | duplicated | cut off | connect s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        results = []
        for i in range(args.runs):
            r = await run_once(server_url, args)
            results.append(r)
            print(
                f"| {i + 1} | {r['events']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | {r['lost']:.0f} "
                f"| {r['duplicated']:.0f} | {r['cut_off']:.0f} | {r['connect_s']:.1f} |",
                flush=True,
            )
        p99 = median([r["p99"] for r in results])
        lost = sum(r["lost"] for r in results)
        duplicated = sum(r["duplicated"] for r in results)
        print(f"\nmedian of runs: p50 {median([r['p50'] for r in results]):.1f} ms, p99 {p99:.1f} ms; ", end="")
        print(f"lost {lost:.0f}, duplicated {duplicated:.0f} in all runs (target p99 ≤ 100 ms, 0 lost, 0 duplicated)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        asyncio.run(write(sys.argv[2], [uuid.UUID(t) for t in sys.argv[5:]], float(sys.argv[3]), float(sys.argv[4])))
    else:
        asyncio.run(main())
