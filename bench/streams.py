"""Streams at chat-widget scale: 10,000 open SSE streams on one API process, 1,000 of them receiving events.

One `agents api` process (or `agents serve`, `--command serve`) serves `--streams` streams, one per thread
(`GET /threads/{id}/events`, as a chat widget opens one per conversation). The client is one asyncio process of bare
sockets (an `asyncio.Protocol` per stream, no task, HTTP/1.0 so the body is raw SSE): cheap enough that 10,000
streams cost it a fraction of a core. The server's RSS is read before the streams open (one warm-up stream open)
and once they all are past their backlog: **memory per open stream = the difference / N** (Python's heap and
buffers; the kernel's socket buffers are not in RSS).

Then a writer of its own process (its clock is not delayed by the readers) makes `--active` of the threads active
for `--seconds`, `--rate` events per second each, spread evenly over time:

- `--kind chunk` (the default): `message_chunk` deltas through `hub.Publisher`, as a worker streaming a model's
  answer publishes them; each delta carries the time it was published, and its lag is its frame's arrival minus that.
- `--kind event`: stored events through `events.append` (NOTIFY at commit), the threads of one time slot written in
  one transaction; lag is arrival minus the moment the commit returned to the writer (as P4 measures it).

Delivery p50/p99 is over every frame the active streams received; the idle ones must receive nothing but keepalives.
The server's CPU during the active phase is given per 1,000 frames delivered.

    .venv/bin/python -m bench.streams [--streams 10000] [--active 1000] [--kind chunk|event] [--rate 5]
        [--seconds 20] [--runs 1] [--command api|serve]

Needs a file descriptor per stream in the client and another in the server: the script raises its soft
`RLIMIT_NOFILE` to streams + 1,000 (the limit is per process; the hard limit must allow it: `ulimit -Hn`), and the
server, its child, inherits it. An active thread is written at most `SLOTS` (20) times a second. Target (issue 34):
≤ 20 KB per open stream, delivery p99 ≤ 100 ms for the active streams.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any, cast

import httpx

from app import db, events, hub
from bench.harness import ROOT, cpu_seconds, database, median, percentile, postgres_server, postgres_version, servers
from bench.harness import setup as print_setup

SLOTS = 20  # each second is cut into this many slots; an active thread is written in one of them
SENT = re.compile(rb'"sent": ?([0-9.]+)')
SEQ = re.compile(rb"(?:^|\n)id: ?([0-9]+)")


class Reader(asyncio.Protocol):
    """One SSE stream over a bare socket: frames counted, and for each one its arrival time, seq and `sent` stamp."""

    def __init__(self, path: str, host: str, connected: asyncio.Future[None]) -> None:
        self._request = f"GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode()
        self._connected = connected
        self._raw = b""  # received, not yet decoded from the chunked body
        self._sse = b""  # decoded, not yet a whole frame
        self._headers = True
        self.frames: list[tuple[float, int | None, float | None]] = []  # arrival, seq, sent
        self.pings = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.WriteTransport, transport).write(self._request)  # uvloop's is not an asyncio class

    def data_received(self, data: bytes) -> None:
        now = time.time()
        raw = self._raw + data
        if self._headers:
            head, sep, raw = raw.partition(b"\r\n\r\n")
            if not sep:
                self._raw = head
                return
            self._headers = False
            if b" 200 " not in head.split(b"\r\n", 1)[0]:
                self._connected.set_exception(RuntimeError(head[:200].decode(errors="replace")))
                return
            self._connected.set_result(None)
        body = []
        while raw:  # the body is chunked (uvicorn chunks a body of unknown length even for HTTP/1.0)
            size_line, sep, rest = raw.partition(b"\r\n")
            if not sep:
                break
            size = int(size_line, 16)
            if len(rest) < size + 2:
                break
            body.append(rest[:size])
            raw = rest[size + 2 :]
        self._raw = raw
        *frames, self._sse = (self._sse + b"".join(body)).split(b"\r\n\r\n")
        for frame in frames:
            if frame.startswith(b":"):
                self.pings += 1
                continue
            seq, sent = SEQ.search(frame), SENT.search(frame)
            self.frames.append((now, int(seq[1]) if seq else None, float(sent[1]) if sent else None))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._connected.done():
            self._connected.set_exception(exc or ConnectionError("closed before the headers"))


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_streams(base: str, paths: list[str], parallel: int = 200) -> list[Reader]:
    """Open a stream per path, `parallel` connecting at once (the listen backlog stays small); when all are open."""
    loop = asyncio.get_running_loop()
    host, port = base.removeprefix("http://").split(":")
    gate = asyncio.Semaphore(parallel)
    readers: list[Reader] = []

    async def one(path: str) -> None:
        async with gate:
            connected = loop.create_future()
            reader = Reader(path, f"{host}:{port}", connected)
            readers.append(reader)
            await loop.create_connection(lambda: reader, host, int(port))
            await asyncio.wait_for(connected, 60)

    await asyncio.gather(*(one(p) for p in paths))
    return readers


async def make_threads(base: str, url: str, n: int) -> list[str]:
    """`n` threads: one made through the API, the rest copied from it in one statement (the API's own path would
    take minutes for 10,000 on this machine, and is not what is measured)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        first = (await client.post("/threads", json={"agent": "bench"})).json()["id"]
    conn = await db.connect(url)
    try:
        rows = await conn.fetch(
            "INSERT INTO threads (id, agent, type, root_id, user_id, status, session_number) "
            "SELECT s.g, t.agent, t.type, s.g, t.user_id, t.status, t.session_number FROM threads t, "
            "(SELECT gen_random_uuid() AS g FROM generate_series(1, $2)) s WHERE t.id = $1 RETURNING id",
            uuid.UUID(first),
            n - 1,
        )
    finally:
        await conn.close()
    return [first, *(str(r["id"]) for r in rows)]


async def run_once(server_url: str, args: argparse.Namespace) -> dict[str, float]:
    pids: list[int] = []
    async with database(server_url) as url, servers(url, [[args.command]], pids=pids) as base:
        pid = pids[0]
        threads = await make_threads(base, url, args.streams + 1)
        warm = await open_streams(base, [f"/threads/{threads[-1]}/events"])  # first-use allocations, not counted
        await asyncio.sleep(1)
        before = rss_kb(pid)
        start = time.perf_counter()
        readers = await open_streams(base, [f"/threads/{t}/events" for t in threads[: args.streams]])
        connect_s = time.perf_counter() - start
        await asyncio.sleep(3)  # every stream past its backlog read, waiting on live events
        opened = rss_kb(pid)
        gc.disable()  # the client keeps every frame's times: collector pauses would show as lag
        cpu, mine, wall = cpu_seconds([pid]), time.process_time(), time.perf_counter()
        sent = await _writer(url, threads[: args.active], args)
        await asyncio.sleep(2)  # the last events on their way
        cpu = cpu_seconds([pid]) - cpu
        mine, wall = time.process_time() - mine, time.perf_counter() - wall
        gc.enable()
        after = rss_kb(pid)
        closed = sum(r.closed for r in readers)
        del warm
    lags: list[float] = []
    late: set[int] = set()  # the seconds in which a frame arrived more than 100 ms late
    delivered = idle_frames = 0
    for i, reader in enumerate(readers):
        if i >= args.active:
            idle_frames += len(reader.frames)
            continue
        delivered += len(reader.frames)
        commits = sent[threads[i]]["seqs"]
        for at, seq, stamp in reader.frames:
            origin = stamp if stamp is not None else commits.get(seq) if seq is not None else None
            if origin is not None:
                lags.append((at - origin) * 1000)
                if at - origin > 0.1:
                    late.add(int(at))
    expected = sum(int(v["count"]) for v in sent.values())
    return {
        "connect_s": connect_s,
        "before_mb": before / 1024,
        "opened_mb": opened / 1024,
        "after_mb": after / 1024,
        "per_stream_kb": (opened - before) / args.streams,
        "expected": expected,
        "delivered": delivered,
        "idle_frames": idle_frames,
        "closed": closed,
        "late": sum(1 for lag in lags if lag > 100),
        "late_seconds": len(late),
        "p50": percentile(lags, 50) if lags else float("nan"),
        "p99": percentile(lags, 99) if lags else float("nan"),
        "max": max(lags) if lags else float("nan"),
        "cpu_ms_per_1000": cpu * 1000 / max(1, delivered) * 1000,
        "server_cores": cpu / wall,
        "client_cores": mine / wall,
    }


async def _writer(url: str, threads: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The writer in a process of its own; for each thread, how many it wrote and each stored event's commit time."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.streams",
        "--write",
        json.dumps({"url": url, "kind": args.kind, "rate": args.rate, "seconds": args.seconds, "threads": threads}),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the writer failed ({proc.returncode})")
    written: dict[str, dict[str, Any]] = json.loads(out)
    for done in written.values():
        done["seqs"] = {int(seq): at for seq, at in done["seqs"].items()}
    return written


async def write(spec: dict[str, Any]) -> None:
    """Write at `rate` per second per thread for `seconds`, each thread in one of `SLOTS` slots per second; print
    per thread how many were written and each stored event's commit time (a delta carries its own)."""
    threads = [uuid.UUID(t) for t in spec["threads"]]
    rate, seconds = float(spec["rate"]), float(spec["seconds"])
    written: dict[str, dict[str, Any]] = {str(t): {"count": 0, "seqs": {}} for t in threads}
    engine = db.create_engine(spec["url"], 2)
    sessions = db.sessionmaker(engine)
    publisher = hub.Publisher(spec["url"])
    ticks = int(seconds * SLOTS)
    per_slot = max(1, round(SLOTS / rate))  # a thread is written every `per_slot` slots
    start = time.monotonic()
    offsets = dict.fromkeys(threads, 0)
    try:
        for tick in range(ticks):
            await asyncio.sleep(max(0.0, start + tick / SLOTS - time.monotonic()))
            due = [t for i, t in enumerate(threads) if (i + tick) % per_slot == 0]
            if spec["kind"] == "chunk":
                for t in due:
                    stamp = time.time()
                    data = {"message_id": str(t), "depth": 0, "offset": offsets[t], "chunk": "token ", "sent": stamp}
                    publisher.publish(t, "message_chunk", {**data, "attempt": 1})
                    offsets[t] += 6
                    written[str(t)]["count"] += 1
                await publisher.sent()
            elif due:
                async with sessions() as session:
                    seqs = [
                        await events.append(session, t, "event", {"event_type": "bench", "data": {"text": "x" * 200}})
                        for t in due
                    ]
                    await session.commit()
                now = time.time()
                for t, seq in zip(due, seqs, strict=True):
                    written[str(t)]["count"] += 1
                    written[str(t)]["seqs"][seq] = now
    finally:
        await publisher.close()
        await engine.dispose()
    print(json.dumps(written))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--active", type=int, default=1_000)
    parser.add_argument("--kind", choices=["chunk", "event"], default="chunk")
    parser.add_argument("--rate", type=float, default=5, help="events per second per active thread")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--command", choices=["api", "serve"], default="api")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.streams + 1_000
    if hard < want:
        raise SystemExit(f"RLIMIT_NOFILE's hard limit is {hard}: {want} needed (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))  # the server inherits it
    with postgres_server() as server_url:
        print_setup(
            "streams at chat-widget scale",
            {
                "runs": args.runs,
                "streams": f"{args.streams} open, one per thread, one `agents {args.command}` process",
                "active": f"{args.active} threads, {args.rate:g} {args.kind}/s each for {args.seconds:g} s",
                "client": "one asyncio process, a Protocol per stream (bare sockets, HTTP/1.0)",
            },
            await postgres_version(server_url),
        )
        print(
            "\n| run | RSS before / open / after MB | KB per stream | frames delivered / written | idle frames "
            "| p50 ms | p99 ms | max ms | > 100 ms: frames (in s) | server CPU ms / 1,000 frames "
            "| cores: server / client | closed | connect s |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        results = []
        for i in range(args.runs):
            r = await run_once(server_url, args)
            results.append(r)
            print(
                f"| {i + 1} | {r['before_mb']:.0f} / {r['opened_mb']:.0f} / {r['after_mb']:.0f} "
                f"| {r['per_stream_kb']:.1f} | {r['delivered']:.0f} / {r['expected']:.0f} | {r['idle_frames']:.0f} "
                f"| {r['p50']:.1f} | {r['p99']:.1f} | {r['max']:.1f} | {r['late']:.0f} ({r['late_seconds']:.0f}) "
                f"| {r['cpu_ms_per_1000']:.0f} "
                f"| {r['server_cores']:.2f} / {r['client_cores']:.2f} | {r['closed']:.0f} "
                f"| {r['connect_s']:.1f} |",
                flush=True,
            )
        print(
            f"\nmedian of runs: {median([r['per_stream_kb'] for r in results]):.1f} KB per stream, delivery p50 "
            f"{median([r['p50'] for r in results]):.1f} ms, p99 {median([r['p99'] for r in results]):.1f} ms "
            "(targets ≤ 20 KB, p99 ≤ 100 ms)"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        asyncio.run(write(json.loads(sys.argv[2])))
    else:
        asyncio.run(main())
