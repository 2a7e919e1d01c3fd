"""Parallel tool calls: one answer asking for several slow tool calls, run one after another or at once.

One `agents serve` process. The model (`bench/agents/models/fanout.py`) answers a message with `--calls` calls of
`nap`, a tool that waits `--seconds` (a search or an HTTP call of seconds), then says done. The clock runs from the
POST to the thread's `idle` status on its stream; each agent runs `--runs` threads in turn. `fanout_serial`'s prompt
leaves `parallel_tool_calls` off (the spec's default), `fanout_parallel`'s sets it.

    .venv/bin/python -m bench.parallel_tools [--calls 2] [--seconds 3] [--runs 3]

Target (issue 31): two 3 s tools of one answer finish in under 4 s with `parallel_tool_calls: true`.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from bench.harness import Stream, database, median, postgres_server, postgres_version, servers, setup


async def turn(client: httpx.AsyncClient, base: str, agent: str) -> float:
    """Seconds from the POST of one message to the end of its turn."""
    thread = (await client.post("/threads", json={"agent": agent})).json()["id"]
    stream = Stream(base, f"/threads/{thread}/events")
    reading = asyncio.create_task(stream.run())
    try:
        await asyncio.wait_for(stream.connected.wait(), 10)
        start = time.perf_counter()
        (await client.post(f"/threads/{thread}/messages", json={"content": "go"})).raise_for_status()
        await stream.until("turn_ended", lambda e: True, timeout=120)
        return time.perf_counter() - start
    finally:
        reading.cancel()


async def main(args: argparse.Namespace) -> None:
    with postgres_server() as server_url:
        env = {"BENCH_CALLS": str(args.calls), "BENCH_TOOL_S": str(args.seconds)}
        setup(
            "Parallel tool calls",
            {"calls per answer": args.calls, "tool seconds": args.seconds, "runs": args.runs},
            await postgres_version(server_url),
        )
        async with (
            database(server_url) as url,
            servers(url, [["serve"]], extra_env=env) as base,
            httpx.AsyncClient(base_url=base, timeout=30) as client,
        ):
            print("| agent | parallel_tool_calls | turn seconds (each run) | median |\n| --- | --- | --- | --- |")
            for agent, parallel in (("fanout_serial", "false"), ("fanout_parallel", "true")):
                times = [await turn(client, base, agent) for _ in range(args.runs)]
                each = ", ".join(f"{t:.2f}" for t in times)
                print(f"| `{agent}` | {parallel} | {each} | **{median(times):.2f}** |")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.parallel_tools", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
