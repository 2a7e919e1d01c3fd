"""Dropped requests under a burst: 400 clients post at once to a server whose model takes 1.5 s, then post again
after an idle pause; every answer is counted and every accepted message looked up in what is stored.

Each simulated user has its own HTTP client (httpx: keep-alive, connections idle up to 5 s are reused). Phase
`burst`: every user posts `?wait=60` at once, then at once again (`--rounds` times). Phase `idle`: every user waits
about `--idle` seconds (by default httpx's own keep-alive expiry, 5 s, ± `--jitter`) and posts again on the
connection it kept. A request that gets no answer is a dropped request; an accepted one (202/200) whose message is
not stored when the server is quiet again is a lost message. The same load runs against the server as configured
(`KEEP_ALIVE_SECONDS` unset) and with each `--keep-alive` value given, so the figures compare in one run.

    .venv/bin/python -m bench.burst [--users 400] [--rounds 2] [--keep-alive 5]

Issue 30, row 13: once, one post of 400 got a closed connection and no response.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time

import httpx

from bench.harness import database, postgres_server, postgres_version, servers, setup


class Tally:
    """What the users saw: answers by status, transport errors by kind, and the ids of accepted messages."""

    def __init__(self) -> None:
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.accepted: list[tuple[str, str]] = []  # (thread, message id)

    async def post(self, client: httpx.AsyncClient, thread: str, content: str, wait: bool) -> None:
        try:
            response = await client.post(
                f"/threads/{thread}/messages", params={"wait": 60} if wait else None, json={"content": content}
            )
        except httpx.TransportError as exc:
            self.outcomes[f"dropped ({type(exc).__name__})"] += 1
            return
        self.outcomes[str(response.status_code)] += 1
        if response.status_code in (200, 202):
            self.accepted.append((thread, response.json()["message_id"]))


async def user(base: str, thread: str, tally: Tally, rounds: int, idle: float, jitter: float) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        for n in range(rounds):
            await tally.post(client, thread, f"burst {n}", wait=True)
        await asyncio.sleep(idle + random.uniform(-jitter, jitter))
        await tally.post(client, thread, "after idle", wait=False)


async def lost(base: str, tally: Tally) -> int:
    """Accepted messages not stored once every thread is idle again."""
    missing = 0
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            busy = (await client.get("/threads", params={"status": "running", "limit": 1})).json()["threads"]
            queued = (await client.get("/threads", params={"status": "queued", "limit": 1})).json()["threads"]
            if not busy and not queued:
                break
            await asyncio.sleep(0.5)
        for thread, message in tally.accepted:
            if (await client.get(f"/threads/{thread}/messages/{message}")).status_code != 200:
                missing += 1
    return missing


async def run(server_url: str, args: argparse.Namespace, keep_alive: str | None) -> dict[str, object]:
    extra = {"BENCH_DELAY_MS": str(args.delay_ms)}
    if keep_alive is not None:
        extra["KEEP_ALIVE_SECONDS"] = keep_alive
    async with database(server_url) as url, servers(url, [["serve"]], extra) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            threads = [(await client.post("/threads", json={"agent": "bench"})).json()["id"] for _ in range(args.users)]
        tally = Tally()
        started = time.monotonic()
        await asyncio.gather(*(user(base, t, tally, args.rounds, args.idle, args.jitter) for t in threads))
        elapsed = time.monotonic() - started
        return {"outcomes": dict(tally.outcomes), "lost": await lost(base, tally), "seconds": round(elapsed, 1)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--users", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--delay-ms", type=int, default=1500)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds each user idles before its last post")
    parser.add_argument("--jitter", type=float, default=0.05)
    parser.add_argument("--keep-alive", action="append", default=[], help="also run with KEEP_ALIVE_SECONDS=<s>")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with postgres_server() as server_url:
        setup(
            "burst: dropped requests under 400 concurrent posts",
            {
                "users": args.users,
                "rounds": args.rounds,
                "model": f"{args.delay_ms} ms",
                "idle": f"{args.idle} ± {args.jitter} s",
            },
            await postgres_version(server_url),
        )
        print(f"{'keep-alive':<12} {'run':<4} {'seconds':>8}  {'lost':>4}  outcomes")
        for keep_alive in [None, *args.keep_alive]:
            for n in range(args.runs):
                result = await run(server_url, args, keep_alive)
                label = "default" if keep_alive is None else f"{keep_alive} s"
                print(f"{label:<12} {n + 1:<4} {result['seconds']:>8}  {result['lost']:>4}  {result['outcomes']}")


if __name__ == "__main__":
    asyncio.run(main())
