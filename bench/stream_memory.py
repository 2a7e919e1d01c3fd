"""Where an open stream's memory goes: `tracemalloc` in an `agents api` process serving `--streams` idle streams.

The server runs under `tracemalloc` (this module, `--serve`, starts it and then runs `agents`); a snapshot is taken
once one warm-up stream is open and again once `--streams` more are (the client is `bench.streams`'s, in this
process). The difference, over the number of streams, is printed by file and by line: what each open stream holds,
ours (`app/`) and the libraries' (uvicorn's per-connection objects are its own, the same for any ASGI app). Traced
bytes are Python's allocations; RSS per stream (also printed) adds the allocator's overhead and tracemalloc's own,
so it is larger here than in `bench.streams`.

    .venv/bin/python -m bench.stream_memory [--streams 2000] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path
from types import FrameType

from bench.harness import AGENTS, ROOT, Process, _until_ready, database, free_port, postgres_server
from bench.streams import make_threads, open_streams, rss_kb


def serve() -> None:
    """`agents api` under tracemalloc; each SIGUSR1 writes a snapshot to `$TRACE_OUT.<n>`."""
    tracemalloc.start(1)
    taken = 0

    def dump(_signum: int, _frame: FrameType | None) -> None:
        nonlocal taken
        gc.collect()
        tracemalloc.take_snapshot().dump(f"{os.environ['TRACE_OUT']}.{taken}")
        taken += 1

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["app", *sys.argv[2:]]
    runpy.run_module("app", run_name="__main__", alter_sys=True)


def _start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "bench.stream_memory", "--serve", "--agents-dir", str(AGENTS), "api"]
    with log.open("wb") as sink:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)


async def measure(streams: int, out: str) -> tuple[int, int]:
    """Open the streams on a traced server; its RSS before and after (KB). Snapshots land in `out.0`, `out.1`."""
    with postgres_server() as server_url:
        async with database(server_url) as url:
            port, log = free_port(), Path(out + ".log")
            env = {**os.environ, "DATABASE_URL": url, "PORT": str(port), "TRACE_OUT": out}
            proc = _start(env, log)
            try:
                base = f"http://127.0.0.1:{port}"
                await _until_ready(base, [Process(["api"], env, log, proc=proc)])
                threads = await make_threads(base, url, streams + 1)
                warm = await open_streams(base, [f"/threads/{threads[-1]}/events"])
                await asyncio.sleep(1)
                before = rss_kb(proc.pid)
                proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(3)
                readers = await open_streams(base, [f"/threads/{t}/events" for t in threads[:streams]])
                await asyncio.sleep(3)  # every stream past its backlog
                opened = rss_kb(proc.pid)
                proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(5)
                del warm, readers
            finally:
                proc.terminate()
                proc.wait(20)
    return before, opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.streams + 1000)), hard))
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        out = str(Path(tmp) / "trace")
        before, opened = asyncio.run(measure(args.streams, out))
        first, second = tracemalloc.Snapshot.load(out + ".0"), tracemalloc.Snapshot.load(out + ".1")
    n = args.streams
    by_file = second.compare_to(first, "filename")
    print(f"{n} streams: RSS {before / 1024:.0f} -> {opened / 1024:.0f} MB, {(opened - before) / n:.1f} KB per stream")
    print(f"traced: {sum(s.size_diff for s in by_file) / n:.0f} bytes per stream\n\n| bytes | blocks | file |")
    print("| ---: | ---: | --- |")
    for stat in by_file[: args.top]:
        print(f"| {stat.size_diff / n:.0f} | {stat.count_diff / n:.1f} | {stat.traceback[0].filename} |")
    print("\n| bytes | blocks | line |\n| ---: | ---: | --- |")
    for stat in second.compare_to(first, "lineno")[: args.top]:
        frame = stat.traceback[0]
        print(f"| {stat.size_diff / n:.0f} | {stat.count_diff / n:.1f} | {frame.filename}:{frame.lineno} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve()
    else:
        main()
