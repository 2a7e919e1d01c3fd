"""P7 — the runtime's own time per step, and whether it grows with the thread's history.

One `agents serve` process, the `steps` agent of `bench/agents` (a zero-latency `test` model that calls the `noop`
tool N times in a turn when told `steps N`, then answers). A turn of N tool steps is timed on the thread's stream:
the interval between one step's `llm_request` and the next one's is a whole step minus nothing (the model answers at
once, the tool returns at once): the runtime's non-LLM time per step. The same is measured on a thread with ~10
messages of history and on one with ~1,000 (filled first by posting messages in a burst, which are delivered
together and answered once), each several times. The server process's CPU time per LLM step over the measured turns
is printed too (the whole turn: its POST, the worker, the stream): it varies much less between runs than the wall
time on a shared machine.

    .venv/bin/python -m bench.p7_step_cost [--runs 3] [--steps 30] [--history 1000] [--profile DIR]

Target (`design/targets.md`): non-LLM time per step p50 ≤ 3 ms, the same at 10 and at 1,000 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from bench.harness import (
    Stream,
    cpu_seconds,
    database,
    median,
    percentile,
    postgres_server,
    postgres_version,
    servers,
    setup,
)


async def idle(stream: Stream, start: int) -> None:
    """Until the thread's status is back to idle after event `start` (the thread was idle then)."""
    await stream.until("thread_status", lambda e: e.data.get("status") == "idle", start)


async def fill(client: httpx.AsyncClient, stream: Stream, thread: str, history: int) -> int:
    """Grow a fresh thread's history to about `history` messages; returns how many it holds."""
    count = 0  # a fresh thread
    while count < history:
        start = len(stream.events)
        batch = min(200, history - count)
        for i in range(batch):
            (await client.post(f"/threads/{thread}/messages", json={"content": f"filler {i}"})).raise_for_status()
        await idle(stream, start)
        count += batch + 1  # the burst is delivered together and answered once
    return count


async def turn(client: httpx.AsyncClient, stream: Stream, thread: str, steps: int) -> list[float]:
    """One turn of `steps` tool steps; the intervals between consecutive `llm_request`s, in ms."""
    start = len(stream.events)
    (await client.post(f"/threads/{thread}/messages", json={"content": f"steps {steps}"})).raise_for_status()
    await idle(stream, start)
    times = [e.at for e in stream.events[start:] if e.type == "llm_request"]
    return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


@contextlib.asynccontextmanager
async def sampled(pid: int, out: Path | None) -> AsyncIterator[None]:
    """With `out`: `py-spy record` samples process `pid` meanwhile (raw format, GIL-holding samples only, into
    `out`; summarise it with `bench/peers/spy_summary.py`)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args = ["record", "--gil", "-r", "200", "-f", "raw", "-o", str(out), "-p", str(pid)]
    proc = await asyncio.create_subprocess_exec(
        spy, *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    await asyncio.sleep(1)  # attached
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        _, err = await proc.communicate()
        if proc.returncode:
            print(f"py-spy failed: {err.decode().strip()[-300:]}", file=sys.stderr)


async def measure(
    base: str,
    client: httpx.AsyncClient,
    history: int,
    steps: int,
    turns: int,
    pids: list[int],
    profile: Path | None = None,
) -> tuple[list[float], float]:
    """The intervals between the measured turns' `llm_request`s (ms), and the server's CPU per step over them (ms);
    `profile`: a py-spy profile of the server over the measured turns is written there."""
    thread = (await client.post("/threads", json={"agent": "steps"})).json()["id"]
    stream = Stream(base, f"/threads/{thread}/events")
    reading = asyncio.create_task(stream.run())
    try:
        await asyncio.wait_for(stream.connected.wait(), 10)
        await fill(client, stream, thread, history)
        await turn(client, stream, thread, 3)  # warm-up
        intervals: list[float] = []
        async with sampled(pids[0], profile):
            used = cpu_seconds(pids)
            for _ in range(turns):
                intervals += await turn(client, stream, thread, steps)
            spent = cpu_seconds(pids) - used
        return intervals, spent * 1000 / (turns * (steps + 1))
    finally:
        reading.cancel()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="tool steps per measured turn")
    parser.add_argument("--turns", type=int, default=3, help="measured turns per thread")
    parser.add_argument("--history", type=int, default=1000, help="messages of history of the long thread")
    parser.add_argument(
        "--log-requests",
        choices=["brief", "full"],
        default="brief",
        help="what each model call's log row keeps (`LOG_REQUESTS`): `brief`, as in production (`agents api` and "
        "`agents worker`, or `serve` off loopback); `full`, the default of `agents serve` with the playground, whose "
        "rows hold the whole request and so grow with the history",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample the server with py-spy over each history's measured turns: DIR/p7-<history>-run<N>.raw "
        "(py-spy on PATH or beside this Python; its own cost shows in the times)",
    )
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with postgres_server() as server_url:
        settings = {"runs": args.runs, "turns": f"{args.turns} per thread of {args.steps} tool steps each"}
        settings["server"] = (
            f"one `agents serve` (API + worker, defaults, LOG_REQUESTS={args.log_requests}), "
            "model and tool answer at once"
        )
        setup("P7 non-LLM time per step, short and long history", settings, await postgres_version(server_url))
        print("\n| run | history | steps | p50 ms | p90 ms | p99 ms | server CPU ms / step |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        p50s: dict[int, list[float]] = {}
        cpus: dict[int, list[float]] = {}
        for i in range(args.runs):
            pids: list[int] = []  # the server's, for its CPU time
            async with (
                database(server_url) as url,
                servers(url, [["serve"]], {"LOG_REQUESTS": args.log_requests}, pids=pids) as base,
                httpx.AsyncClient(base_url=base, timeout=30) as client,
            ):
                for history in (10, args.history):
                    out = args.profile / f"p7-{history}-run{i + 1}.raw" if args.profile else None
                    values, cpu = await measure(base, client, history, args.steps, args.turns, pids, out)
                    p50 = percentile(values, 50)
                    p50s.setdefault(history, []).append(p50)
                    cpus.setdefault(history, []).append(cpu)
                    row = f"| {i + 1} | {history} | {len(values)} | {p50:.1f} | {percentile(values, 90):.1f} |"
                    print(f"{row} {percentile(values, 99):.1f} | {cpu:.1f} |", flush=True)
        summary = ", ".join(
            f"{h} messages p50 {median(v):.1f} ms (server CPU {median(cpus[h]):.1f} ms)" for h, v in p50s.items()
        )
        print(f"\nmedian of runs: {summary} (target ≤ 3 ms at both)")


if __name__ == "__main__":
    asyncio.run(main())
