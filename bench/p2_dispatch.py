"""P2 — dispatch latency: `POST /messages` → the `llm_request` event on the thread's stream, idle server.

One `agents serve` process (API and worker pool). A client follows a fresh thread's stream, then posts one message;
the clock runs from just before the POST is sent to the moment the `llm_request` event is read off the stream. The
next sample starts only after the thread is idle again, so the server is idle at every POST. Several runs, each on
a fresh database and server; the table reports each run and the median of the runs.

    .venv/bin/python -m bench.p2_dispatch [--runs 3] [--samples 200] [--warmup 20]

Target (`design/targets.md`): p50 ≤ 10 ms, p99 ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from bench.harness import Stream, database, median, percentile, postgres_server, postgres_version, servers, setup


async def sample(client: httpx.AsyncClient, base: str) -> float:
    """One dispatch, in ms: a new thread, its stream open, POST a message, until `llm_request` arrives."""
    thread = (await client.post("/threads", json={"agent": "bench"})).json()["id"]
    stream = Stream(base, f"/threads/{thread}/events")
    reading = asyncio.create_task(stream.run())
    try:
        await asyncio.wait_for(stream.connected.wait(), 10)
        requested = stream.wait_for("llm_request")
        start = time.perf_counter()
        response = await client.post(f"/threads/{thread}/messages", json={"content": "hi"})
        response.raise_for_status()
        event = await asyncio.wait_for(requested, 10)
        elapsed = (time.perf_counter() - start) * 1000
        del event
        # idle again before the next sample: the run ends with the thread's status back to idle
        await stream.until("thread_status", lambda e: e.data.get("status") == "idle", timeout=10)
        return elapsed
    finally:
        reading.cancel()


async def run_once(server_url: str, samples: int, warmup: int) -> list[float]:
    async with (
        database(server_url) as url,
        servers(url, [["serve"]]) as base,
        httpx.AsyncClient(base_url=base, timeout=10) as client,
    ):
        for _ in range(warmup):
            await sample(client, base)
        return [await sample(client, base) for _ in range(samples)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    with postgres_server() as server_url:
        settings = {"runs": args.runs, "samples": f"{args.samples} per run (+{args.warmup} warm-up)"}
        settings["server"] = "one `agents serve` (API + worker, defaults), model delay 0"
        setup(
            "P2 dispatch latency: POST /messages → llm_request on the stream",
            settings,
            await postgres_version(server_url),
        )
        p50s, p99s = [], []
        print("\n| run | p50 ms | p90 ms | p99 ms | max ms |\n| --- | --- | --- | --- | --- |")
        for i in range(args.runs):
            values = await run_once(server_url, args.samples, args.warmup)
            p50, p90, p99 = (percentile(values, p) for p in (50, 90, 99))
            p50s.append(p50)
            p99s.append(p99)
            print(f"| {i + 1} | {p50:.1f} | {p90:.1f} | {p99:.1f} | {max(values):.1f} |", flush=True)
        print(f"\nmedian of runs: p50 {median(p50s):.1f} ms, p99 {median(p99s):.1f} ms (target p50 ≤ 10, p99 ≤ 50)")


if __name__ == "__main__":
    asyncio.run(main())
